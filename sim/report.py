"""Replay and demo reports: summary numbers from request outcomes, and a printed table."""

from __future__ import annotations

import time

from collections import Counter
from typing import Any

import numpy as np

from sim.questions import KINDS
from sim.replay import Outcome

EXACT_VALUES = {"hit", "exact"}  # X-Cache: "hit" (issue 2 router), "exact" (issue 3 onwards)
SEMANTIC_VALUES = {"semantic"}
# The router stores an answer just after sending it: a repeat sent this long after an identical
# request was answered must find it.
STORE_SLACK_S = 1.0


def percentiles_ms(values_s: list[float]) -> dict[str, float | None]:
    """p50/p95/p99 in milliseconds (linear interpolation); None each when there is no value."""
    if not values_s:
        return {"p50": None, "p95": None, "p99": None}
    p = np.percentile(np.asarray(values_s) * 1000.0, [50, 95, 99])
    return {"p50": round(float(p[0]), 1), "p95": round(float(p[1]), 1), "p99": round(float(p[2]), 1)}


def summarize(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    """Report dict: requests, ok, failed, errors, exact_hits, semantic_hits, hit_ratio
    (hits / requests), latency_ms and ttft_ms (p50/p95/p99 over ok requests), replica_share
    (replica -> fraction of forwarded requests, i.e. ok responses naming a replica), by_kind
    (prompt kind -> requests and hits), repeats_after_answer (repeats sent at least
    STORE_SLACK_S after an identical request was answered by a replica: requests and exact hits;
    a working cache hits every one), wall_s, lag_ms (how late requests started)."""
    ok = [o for o in outcomes if o.ok]
    exact = sum(1 for o in ok if o.cache in EXACT_VALUES)
    semantic = sum(1 for o in ok if o.cache in SEMANTIC_VALUES)
    replicas = Counter(o.replica for o in ok if o.replica)
    forwarded = sum(replicas.values())
    by_kind = {}
    for kind in KINDS:
        of_kind = [o for o in outcomes if o.kind == kind]
        by_kind[kind] = {
            "requests": len(of_kind),
            "exact_hits": sum(1 for o in of_kind if o.ok and o.cache in EXACT_VALUES),
            "semantic_hits": sum(1 for o in of_kind if o.ok and o.cache in SEMANTIC_VALUES),
        }
    # prompt -> earliest end of an answer a replica gave: only those are stored under their own
    # body (a semantic hit is not stored again, so its repeats may hit semantically again)
    answered: dict[str, float] = {}
    for o in ok:
        if o.cache in EXACT_VALUES or o.cache in SEMANTIC_VALUES:
            continue
        end = o.sent_s + o.latency_s
        answered[o.prompt] = min(end, answered.get(o.prompt, end))
    after = [o for o in outcomes if o.kind == "repeat" and o.prompt in answered
             and answered[o.prompt] + STORE_SLACK_S <= o.sent_s]
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failed": len(outcomes) - len(ok),
        "errors": dict(Counter(o.error for o in outcomes if o.error)),
        "exact_hits": exact,
        "semantic_hits": semantic,
        "hit_ratio": round((exact + semantic) / len(outcomes), 4) if outcomes else 0.0,
        "latency_ms": percentiles_ms([o.latency_s for o in ok]),
        "ttft_ms": percentiles_ms([o.ttft_s for o in ok if o.ttft_s is not None]),
        "replica_share": {r: round(n / forwarded, 4) for r, n in sorted(replicas.items())},
        "by_kind": by_kind,
        "repeats_after_answer": {"requests": len(after),
                                 "exact_hits": sum(1 for o in after if o.ok and o.cache in EXACT_VALUES)},
        "wall_s": round(wall_s, 1),
        "lag_ms": percentiles_ms([o.lag_s for o in outcomes]),
    }


def _pcts(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[k] is None else f"{d[k]:.0f}" for k in ("p50", "p95", "p99"))


def _cell(value: object, width: int) -> str:
    text = f"{value:.1f}" if isinstance(value, float) else ("-" if value is None else str(value))
    return f"{text:>{width}}"


def render(report: dict[str, Any]) -> str:
    """Readable table of a report (replay keys, plus forecast_plan when present)."""
    rows = [
        ("requests", report["requests"]),
        ("ok / failed", f"{report['ok']} / {report['failed']}"),
        ("errors", ", ".join(f"{k}: {v}" for k, v in report["errors"].items()) or "-"),
        ("exact / semantic hits", f"{report['exact_hits']} / {report['semantic_hits']}"),
        ("hit ratio", f"{report['hit_ratio']:.1%}"),
        ("latency ms p50/p95/p99", _pcts(report["latency_ms"])),
        ("TTFT ms p50/p95/p99", _pcts(report["ttft_ms"])),
        ("start lag ms p50/p95/p99", _pcts(report["lag_ms"])),
        ("wall seconds", report["wall_s"]),
    ]
    lag_p95 = (report.get("lag_ms") or {}).get("p95")
    if lag_p95 is not None and lag_p95 > 1000:  # sent late: the replay no longer follows the trace's timing
        rows.append(("warning", f"requests were sent up to {lag_p95 / 1000:.0f} s (p95) after their trace time: "
                                "the machine could not keep up, so the replicas did not see the trace's timing"))
    if report.get("logs"):
        rows.append(("logs", f"{report['logs']} (router, replicas, forecast.json)"))
    if report.get("sample_fraction", 1.0) < 1.0:
        rows.append(("trace requests kept", f"{report['sample_fraction']:.1%} (trace thinned)"))
    profiles = {r.get("url"): r.get("profile") for r in report.get("replicas") or []}
    for replica, share in report["replica_share"].items():
        profile = f" ({profiles[replica]})" if profiles.get(replica) else ""
        rows.append((f"share {replica}{profile}", f"{share:.1%}"))
    for kind, k in report["by_kind"].items():
        rows.append((f"prompts {kind}", f"{k['requests']} (exact hits {k['exact_hits']}, semantic {k['semantic_hits']})"))
    after = report.get("repeats_after_answer")
    if after is not None:
        rows.append(("repeats after an answer", f"{after['requests']} (exact hits {after['exact_hits']})"))
    pool = report.get("questions")
    if pool and pool.get("exhausted"):
        rows.append(("question pool", f"all {pool['pairs']} pairs used by {pool['last_new_at_s']} s: later prompts "
                                      "only repeat (cache hits), so replicas and forecaster see little demand"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    if "forecast_plan" in report:
        lines.append("")
        plan = report["forecast_plan"]
        if plan is None:
            lines.append(f"forecast: not available ({report.get('forecast_error', 'no result')})")
        else:
            lines.extend(_forecast_lines(report, plan))
    return "\n".join(lines)


def _when(minute: object) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute * 60)) if isinstance(minute, int) else str(minute)


def _forecast_lines(report: dict[str, Any], plan: list[dict[str, Any]]) -> list[str]:
    """What the forecaster saw (cache misses the router counted), decided and scaled, and its
    plan with runs of equal rows folded into one line."""
    decision = report.get("forecast_decision") or {}
    lines = [f"forecaster ({report.get('forecast_model', '?')}), on the router's simulated clock, in cache "
             "misses per simulated second (the demand that reaches the GPUs):"]
    requests, hits = report.get("requests", 0), report.get("exact_hits", 0) + report.get("semantic_hits", 0)
    if requests:
        lines.append(f"  saw: {requests - hits} of {requests} requests reach a replica ({1 - hits / requests:.0%}); "
                     "hits never count as demand")
    lines.append(f"  decided: {decision.get('replicas', '?')} replicas ({decision.get('reason', '')})")
    # the decision's action is the planner's ("set", "hold"); the demo's forecaster always runs
    # in dry-run (demo.py forces it), so nothing is ever scaled here
    lines.append("  scaled: nothing (dry-run: the demo has no Kubernetes; `python -m sim loop` scales a real "
                 "Deployment)")
    lines.append(f"  {'minutes (UTC)':>33}  {'forecast':>9}  {'upper':>9}  {'replicas':>8}")
    keys = ("forecast", "upper", "replicas")
    i = 0
    while i < len(plan):
        j = i
        while j + 1 < len(plan) and all(plan[j + 1].get(k) == plan[i].get(k) for k in keys):
            j += 1
        span = _when(plan[i].get("minute")) if i == j else f"{_when(plan[i].get('minute'))} .. {_when(plan[j].get('minute'))[-5:]}"
        cells = (f"{v:>{w}.3f}" if isinstance(v, float) else _cell(v, w)
                 for v, w in ((plan[i].get("forecast"), 9), (plan[i].get("upper"), 9), (plan[i].get("replicas"), 8)))
        note = f"  ({j - i + 1} minutes alike)" if j > i else ""
        lines.append("  " + "  ".join([f"{span:>33}", *cells]) + note)
        i = j + 1
    return lines

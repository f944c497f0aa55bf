"""Replay reports: summary numbers from request outcomes, and a printed table (the demo adds
its forecaster section to it: sim/demo/report.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.client.questions import KINDS
from sim.client.replay import Outcome

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


def judge_semantic_hits(outcomes: list[Outcome]) -> dict[int, str]:
    """Each ok semantic hit (by ``id()`` of its Outcome) judged "right", "wrong" or "unchecked".

    A cached answer keeps the ``id`` the replica gave it, so the hit's ``answer_id`` names the
    request whose answer made the entry. Right when that request asked the same question (the
    same ``source``: the question itself, or a paraphrase of it); wrong when it asked another
    one, and always for a near-miss (it asks another question by construction); unchecked when
    no replica answer with that id was seen (a missing id, an entry from before the replay)."""
    made_by: dict[str, str] = {}  # answer id -> the source of the request a replica answered
    for o in outcomes:
        if o.ok and o.answer_id and o.cache not in EXACT_VALUES and o.cache not in SEMANTIC_VALUES:
            made_by.setdefault(o.answer_id, o.source)
    verdicts: dict[int, str] = {}
    for o in outcomes:
        if not (o.ok and o.cache in SEMANTIC_VALUES):
            continue
        if o.kind == "near_miss":
            verdicts[id(o)] = "wrong"
        elif o.answer_id is None or o.answer_id not in made_by:
            verdicts[id(o)] = "unchecked"
        else:
            verdicts[id(o)] = "right" if made_by[o.answer_id] == o.source else "wrong"
    return verdicts


def summarize(outcomes: list[Outcome], wall_s: float) -> dict[str, Any]:
    """Report dict: requests, ok, failed, errors, exact_hits, semantic_hits, hit_ratio
    (hits / requests), latency_ms and ttft_ms (p50/p95/p99 over ok requests), replica_share
    (replica -> fraction of forwarded requests, i.e. ok responses naming a replica), by_kind
    (prompt kind -> requests, hits, and semantic hits judged right / wrong / unchecked by
    ``judge_semantic_hits``), repeats_after_answer (repeats sent at least
    STORE_SLACK_S after an identical request was answered by a replica: requests and exact hits;
    a working cache hits every one), wall_s, lag_ms (how late requests started)."""
    ok = [o for o in outcomes if o.ok]
    exact = sum(1 for o in ok if o.cache in EXACT_VALUES)
    semantic = sum(1 for o in ok if o.cache in SEMANTIC_VALUES)
    replicas = Counter(o.replica for o in ok if o.replica)
    forwarded = sum(replicas.values())
    judged = judge_semantic_hits(outcomes)
    by_kind = {}
    for kind in KINDS:
        of_kind = [o for o in outcomes if o.kind == kind]
        verdicts = Counter(judged[id(o)] for o in of_kind if id(o) in judged)
        by_kind[kind] = {
            "requests": len(of_kind),
            "exact_hits": sum(1 for o in of_kind if o.ok and o.cache in EXACT_VALUES),
            "semantic_hits": sum(1 for o in of_kind if o.ok and o.cache in SEMANTIC_VALUES),
            "semantic_right": verdicts["right"],
            "semantic_wrong": verdicts["wrong"],
            "semantic_unchecked": verdicts["unchecked"],
        }
    # prompt -> earliest end of an answer a replica gave: only those are stored under their own
    # body (a semantic hit is not stored again, so its repeats may hit semantically again)
    answered: dict[str, float] = {}
    for o in ok:
        if o.cache in EXACT_VALUES or o.cache in SEMANTIC_VALUES:
            continue
        end = o.sent_s + o.latency_s
        answered[o.prompt] = min(end, answered.get(o.prompt, end))
    after = [
        o
        for o in outcomes
        if o.kind == "repeat" and o.prompt in answered and answered[o.prompt] + STORE_SLACK_S <= o.sent_s
    ]
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
        "repeats_after_answer": {
            "requests": len(after),
            "exact_hits": sum(1 for o in after if o.ok and o.cache in EXACT_VALUES),
        },
        "wall_s": round(wall_s, 1),
        "lag_ms": percentiles_ms([o.lag_s for o in outcomes]),
    }


def demand_minutes(outcomes: list[Outcome], sim_time: Callable[[float], float]) -> list[dict[str, int]]:
    """Requests per simulated minute, in the minute each was answered, as the router's traffic
    counters count them (at the end of the answer; ``sim_time`` maps a perf_counter() time to
    simulated Unix s): ``{"minute", "sent", "hits", "misses", "failed"}``, counts, minutes with
    no request left out. hits: answered from the cache (exact or semantic); misses: answered by a
    replica (forwarded: what reaches the GPUs); failed: not answered."""
    rows: dict[int, dict[str, int]] = {}
    for o in outcomes:
        minute = int(sim_time(o.sent_s + o.latency_s) // 60)
        row = rows.setdefault(minute, {"minute": minute, "sent": 0, "hits": 0, "misses": 0, "failed": 0})
        row["sent"] += 1
        hit = o.cache in EXACT_VALUES or o.cache in SEMANTIC_VALUES
        row["failed" if not o.ok else "hits" if hit else "misses"] += 1
    return [rows[m] for m in sorted(rows)]


def _pcts(d: dict[str, float | None]) -> str:
    return " / ".join("-" if d[k] is None else f"{d[k]:.0f}" for k in ("p50", "p95", "p99"))


def render(report: dict[str, Any]) -> str:
    """Readable table of a replay report's keys (and the demo's optional ones: logs, replicas,
    questions); the demo's forecaster section is rendered by sim/demo/report.py."""
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
        rows.append(
            (
                "warning",
                f"requests were sent up to {lag_p95 / 1000:.0f} s (p95) after their trace time: "
                "the machine could not keep up, so the replicas did not see the trace's timing",
            )
        )
    if report.get("logs"):
        rows.append(("logs", f"{report['logs']} (router, replicas, forecast.json)"))
    if report.get("sample_fraction", 1.0) < 1.0:
        rows.append(("trace requests kept", f"{report['sample_fraction']:.1%} (trace thinned)"))
    profiles = {r.get("url"): r.get("profile") for r in report.get("replicas") or []}
    # every replica the demo started, with its GPU profile, even one that got no request
    for replica in [*profiles, *(r for r in report["replica_share"] if r not in profiles)]:
        profile = f" ({profiles[replica]})" if profiles.get(replica) else ""
        rows.append((f"share {replica}{profile}", f"{report['replica_share'].get(replica, 0.0):.1%}"))
    for kind, k in report["by_kind"].items():
        rows.append(
            (f"prompts {kind}", f"{k['requests']} (exact hits {k['exact_hits']}, semantic {k['semantic_hits']})")
        )
    after = report.get("repeats_after_answer")
    if after is not None:
        rows.append(("repeats after an answer", f"{after['requests']} (exact hits {after['exact_hits']})"))
    pool = report.get("questions")
    if pool and pool.get("exhausted"):
        rows.append(
            (
                "question pool",
                f"all {pool['pairs']} pairs used by {pool['last_new_at_s']} s: later prompts "
                "only repeat (cache hits), so replicas and forecaster see little demand",
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

"""The demo's report in text: the replay table (sim/client/report.py), then its forecaster
section: demand in one unit side by side (requests sent, cache hits, misses forwarded, the
forecast of misses), the history the forecaster read, the capacity and headroom its replicas
follow from with the arithmetic at the warm-up lead, the decision, and the plan summed up. Every
minute is in the picture (sim/demo/plot.py)."""

from __future__ import annotations

import math
import time
from typing import Any

from sim.client.report import render as render_replay

LABEL = 58  # width of the demand table's row labels
CELL = 14


def render(report: dict[str, Any]) -> str:
    """The demo's report as text: the replay table, then the forecaster section when the report
    holds ``forecast_plan`` (None there when the forecaster failed: the section says why)."""
    text = render_replay(report)
    story = cache_lines(report)
    if story:
        text = "\n".join([text, "", *story])
    if "forecast_plan" not in report:
        return text
    return "\n".join([text, "", *forecast_lines(report)])


def cache_lines(report: dict[str, Any]) -> list[str]:
    """The cache's story (issue 34): paraphrases answered with their own question's answer,
    near-misses refused, every semantic hit that served another question's answer (judged by the
    answer's id, whatever the prompt's kind), and the replica (GPU) seconds the hits saved, from
    the router's /cache/stats. Empty when the report has no per-kind counts."""
    kinds = report.get("by_kind") or {}
    if not kinds:
        return []

    def share(n: int, of: int) -> str:
        return f"{n} of {of} ({n / of:.0%})" if of else f"{n} of 0"

    para, near, new = (kinds.get(k, {}) for k in ("paraphrase", "near_miss", "new"))
    answered = int(para.get("semantic_right", para.get("semantic_hits", 0)))
    near_answered = int(near.get("semantic_hits", 0))
    # every semantic hit, judged by the answer's id (sim/client/report.py judge_semantic_hits)
    wrong = sum(int(k.get("semantic_wrong", 0)) for k in kinds.values())
    unchecked = sum(int(k.get("semantic_unchecked", 0)) for k in kinds.values())
    hits = sum(int(k.get("semantic_hits", 0)) for k in kinds.values())
    lines = [
        "cache, by meaning (prompt kinds of sim/client/questions.py):",
        f"  paraphrases answered with their own question's answer: {share(answered, int(para.get('requests', 0)))}",
        f"  near-misses refused (same words, another question): "
        f"{share(int(near.get('requests', 0)) - near_answered, int(near.get('requests', 0)))}",
        f"  semantic hits that served another question's answer (wrong answers): {wrong} of {hits}"
        + (f" ({unchecked} could not be checked: no answer id)" if unchecked else ""),
    ]
    stats = report.get("router_cache_stats") or {}
    saved = stats.get("replica_seconds_saved")
    if isinstance(saved, int | float):
        lines.append(
            f"  GPU-seconds saved: {saved:.1f} replica seconds the hits did not use (router /cache/stats, "
            "estimated from the prompt and answer tokens)"
        )
    return lines


def when(minute: object) -> str:
    """A Unix minute as UTC ``YYYY-MM-DD HH:MM``."""
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(minute * 60)) if isinstance(minute, int) else str(minute)


def forecast_lines(report: dict[str, Any]) -> list[str]:
    """The section's lines; the report holds ``forecast_plan`` (None when the forecaster failed)."""
    plan = report["forecast_plan"]
    lines = demand_table(report, plan or [])
    lines += [""] if lines else []  # the table, then the forecaster
    if plan is None:
        return [*lines, f"forecast: not available ({report.get('forecast_error', 'no result')})"]
    decision = report.get("forecast_decision") or {}
    lines.append(
        f"forecaster ({report.get('forecast_model', '?')}), on the router's simulated clock, in cache "
        "misses per simulated second (the demand that reaches the GPUs):"
    )
    requests, hits = report.get("requests", 0), report.get("exact_hits", 0) + report.get("semantic_hits", 0)
    if requests:
        lines.append(
            f"  saw: {requests - hits} of {requests} requests reach a replica ({1 - hits / requests:.0%}); "
            "hits never count as demand"
        )
    history = history_line(report.get("forecast_series") or {}, str(report.get("redis", "")))
    if history:
        lines.append(f"  {history}")
    planner = report.get("forecast_planner")
    if planner:
        lines.extend(f"  {line}" for line in capacity_lines(planner, plan, report.get("forecast_capacity_source")))
    lines.append(f"  decided: {decision.get('replicas', '?')} replicas ({decision.get('reason', '')})")
    # the decision's action is the planner's ("set", "hold"); the demo's forecaster always runs
    # in dry-run (sim/demo/run.py forces it), so nothing is ever scaled here
    lines.append(
        "  scaled: nothing (dry-run: the demo has no Kubernetes; `python -m sim loop` scales a real Deployment)"
    )
    if plan:
        lines.append(
            f"  plan: {_span(plan, 'replicas', '{:.0f}')} replicas over the next {len(plan)} minutes "
            f"from {when(plan[0].get('minute'))}"
        )
    if report.get("plot"):
        lines.append(
            f"  picture: {report['plot']} (per simulated minute: requests sent, cache hits, misses "
            "forwarded, the forecast and its band, the planned replicas)"
        )
    return lines


def demand_table(report: dict[str, Any], plan: list[dict[str, Any]]) -> list[str]:
    """Sent, hit, forwarded and forecast, per simulated second, side by side: the replay's mean,
    its last full minute (the forecaster's latest input) and the forecast's range."""
    rows = report.get("demand_minutes") or []
    if not rows and not plan:
        return []
    speedup = report.get("speedup")
    unit = f"per simulated second (x{speedup:g} = per wall second)" if speedup else "per simulated second"
    last = plan[0]["minute"] - 1 if plan else (rows[-1]["minute"] - 1 if rows else None)
    span = rows[-1]["minute"] - rows[0]["minute"] + 1 if rows else 0
    at_last = next((r for r in rows if r["minute"] == last), None)
    heads = (
        ("replay mean", f"({span} min)" if rows else ""),
        ("last minute", "" if last is None else f"({when(last)[-5:]})"),
        (f"next {len(plan)} min" if plan else "forecast", f"from {when(plan[0]['minute'])[-5:]}" if plan else ""),
    )
    lines = [
        (f"{label:<{LABEL}}" + "".join(f"{h[i]:>{w}}" for h, w in zip(heads, (CELL, CELL, CELL + 4)))).rstrip()
        for i, label in enumerate(("demand " + unit, "by the minute each was answered (as the router counts)"))
    ]

    def measured(label: str, key: str) -> str:
        mean = f"{sum(r[key] for r in rows) / (span * 60):.3f}" if rows else "-"
        # a minute without any request sent is a 0, not a gap: the replay ran through it
        minute = f"{(at_last or {}).get(key, 0) / 60:.3f}" if rows and last is not None else "-"
        return f"  {label:<{LABEL - 2}}{mean:>{CELL}}{minute:>{CELL}}{'-':>{CELL + 4}}"

    lines += [
        measured("sent requests/s", "sent"),
        measured("cache hits/s", "hits"),
        measured("misses forwarded/s (what reaches the GPUs)", "misses"),
    ]
    for label, key in (("forecast misses/s: mean", "forecast"), ("forecast misses/s: upper band", "upper")):
        lines.append(f"  {label:<{LABEL - 2}}{'-':>{CELL}}{'-':>{CELL}}{_span(plan, key, '{:.3f}'):>{CELL + 4}}")
    if rows:  # the router stamps its own count, milliseconds apart: a minute is a wall second at 60x
        lines.append(
            "  (timed by the load generator: a request answered at a minute's edge may count in the next "
            "minute for the router)"
        )
    return lines


def history_line(series: dict[str, Any], redis: str) -> str | None:
    """What the forecaster's window held: counted buckets, the missing ones before the first
    count (expected: no router was counting) and the missing ones since (minutes nobody counted)."""
    buckets, missing = series.get("buckets"), series.get("missing_buckets")
    if buckets is None or missing is None:
        return None
    step = float(series.get("step_s") or 60.0)
    before = int(series.get("missing_before_first") or 0)
    days = buckets * step / 86400
    window = f"{days:g}-day" if days >= 1 else f"{buckets * step / 3600:g}-hour"
    size = "one-minute" if step == 60 else f"{step:g} s"
    line = f"history: {buckets - missing} of {buckets} {size} buckets counted in the {window} window it reads"
    if before:
        who = "this demo's router started" if redis.startswith("embedded") else "any router counted into this Redis"
        line += (
            f"; the {before} before the first counted one are from before {who} (counted by nobody: missing, "
            "left out of the fit, not zero)"
        )
    return f"{line}; {missing - before} missing since"


def capacity_lines(planner: dict[str, Any], plan: list[dict[str, Any]], source: object) -> list[str]:
    """The capacity and headrooms the forecaster planned with, and the planner's arithmetic,
    max(ceil(mean x (1 + headroom) / capacity), ceil(upper x (1 + upper headroom) / capacity))
    within the bounds (forecaster/plan.py), for the step that needs most among those the
    decision covers. The decision itself may be higher (the current demand's floor, its reason
    says so) or held back (cooldowns, stabilisation) on a daemon's later runs."""
    cap, head = planner["capacity_per_replica"], planner["headroom"]
    upper_head = head if planner.get("upper_headroom") is None else planner["upper_headroom"]
    lo, hi = planner["min_replicas"], planner["max_replicas"]
    lines = [
        f"capacity: {_num(cap, '{:.3g}')} misses/s per replica"
        + (f" ({source})" if source else "")
        + f"; headroom {_num(head, '{:.0%}')} over the mean, {_num(upper_head, '{:.0%}')} over the upper band; "
        f"{lo} .. {hi} replicas"
    ]
    # replicas ordered now serve the steps overlapping [lead, lead + decision interval)
    # (plan.covered); the decision takes the most any of them needs
    lead = planner.get("lead_time_s", 0.0)
    end = lead + planner.get("decision_interval_s", 0.0)
    step_s = 60 * (plan[1]["minute"] - plan[0]["minute"]) if len(plan) > 1 else 60
    covered = [
        s
        for s in plan
        if (s["minute"] - plan[0]["minute"]) * 60 < max(end, lead + 1e-9)
        and (s["minute"] - plan[0]["minute"]) * 60 + step_s > lead
    ]
    if covered:
        needs = [(_need(s, cap, head, upper_head, lo, hi), s) for s in covered]
        # a step whose need cannot be computed (a value not finite, no usable capacity) is shown
        (need, mean, upper), step = max(needs, key=lambda n: (n[0][0] is None, n[0][0] or 0))
        ahead = [s["minute"] - plan[0]["minute"] for s in covered]
        span = f"+{ahead[0]} .. +{ahead[-1]} min" if len(ahead) > 1 else f"+{ahead[0]} min"
        factor, upper_factor, per = _num(1 + head, "{:.2f}"), _num(1 + upper_head, "{:.2f}"), _num(cap, "{:.3g}")
        line = (
            f"at +{step['minute'] - plan[0]['minute']} min (of the steps {span}, from the warm-up lead to the "
            f"next decision): mean {_num(step['forecast'], '{:.3f}')} x {factor} / {per} = {_num(mean, '{:.2f}')}, "
            f"upper {_num(step['upper'], '{:.3f}')} x {upper_factor} / {per} = {_num(upper, '{:.2f}')} -> "
            f"{'n/a' if need is None else need} replicas"
        )
        if step.get("replicas") != need:
            line += f" (the forecaster's plan says {_num(step.get('replicas'), '{}')})"
        lines.append(line)
    return lines


def _need(
    step: dict[str, Any], cap: float, head: float, upper_head: float, lo: int, hi: int
) -> tuple[int | None, float, float]:
    """(replicas, mean term, upper term) for one plan step: forecaster/plan.py's rule; replicas
    None (and a term nan) when a value is not a finite number or the capacity is not positive."""
    if not (_finite(cap) and cap > 0):
        return None, math.nan, math.nan
    mean, upper = (
        step[key] * (1 + h) / cap if _finite(step.get(key)) and _finite(h) else math.nan
        for key, h in (("forecast", head), ("upper", upper_head))
    )
    if not (_finite(mean) and _finite(upper)):  # a tiny capacity overflows to inf
        return None, mean, upper
    return max(lo, min(hi, max(math.ceil(mean - 1e-9), math.ceil(upper - 1e-9)))), mean, upper


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _num(value: object, fmt: str) -> str:
    """``value`` in ``fmt``, or n/a when it is not a finite number."""
    return fmt.format(value) if _finite(value) else "n/a"


def _span(plan: list[dict[str, Any]], key: str, fmt: str) -> str:
    """The range of the plan's finite ``key`` values, with how many are not finite numbers."""
    values = [step[key] for step in plan if _finite(step.get(key))]
    if not values:
        return "n/a" if plan else "-"
    unknown = len(plan) - len(values)
    return f"{fmt.format(min(values))} .. {fmt.format(max(values))}" + (f" ({unknown} n/a)" if unknown else "")

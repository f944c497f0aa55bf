"""Replay of labelled lookups through the per-entry bound (``python -m cache eval-bound``).

A stream is a list of ``Lookup``: which entry the cache would consider (the pair's stored text,
or the nearest stored origin), at what score, and whether its answer would be right. Each
lookup, in order:

- score below the prior's floor: a plain miss, nothing learned;
- ``decide`` says "serve": a hit (wrong when the label says so); with probability
  ``label_rate`` it is shadow-verified (the request also goes to the replica, off the client's
  path, and the answers are compared): one replica call, and the entry and pool learn the label;
- ``decide`` says "explore": a miss, forwarded as any miss; with probability ``compare_rate``
  the replica's answer is compared with the candidate's cached one (no extra replica call)
  and the entry and pool learn the label;
- ``client_report_rate``: the share of *wrong* served hits whose client reports it
  (``POST /v1/cache/feedback``): the entry learns "wrong" (no cost); the pool does not (a
  client's report may not make other tenants' hits rarer).

The draws come from one seeded generator, so a run is reproducible. Pure apart from it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cache.verify.bound.model import BoundPrior, EntryState, decide, update_entry, update_pool
from cache.verify.rules import verify


@dataclass(frozen=True)
class Lookup:
    """One lookup of the stream: entry (its id), score (cosine), right (the label)."""

    entry: str
    score: float
    right: bool


def wilson_upper(failures: int, total: int, z: float = 1.645) -> float | None:
    """One-sided 95 % upper confidence bound of a binomial proportion; None when total is 0."""
    if total == 0:
        return None
    p = failures / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return (centre + spread) / (1 + z * z / total)


def replay(
    stream: Sequence[Lookup],
    prior: BoundPrior,
    delta: float,
    label_rate: float,
    positives: int,
    client_report_rate: float = 0.0,
    seed: int = 0,
    compare_rate: float | None = None,
) -> dict[str, Any]:
    """Run the stream; returns counts and rates (plain data). ``label_rate``: the share of
    served hits shadow-verified; ``compare_rate``: the share of explored misses compared
    (None: ``label_rate``). ``positives``: the lookups that had a right answer to find
    (recall's denominator)."""
    compare = label_rate if compare_rate is None else compare_rate
    rng = random.Random(seed)
    entries: dict[str, EntryState] = {}
    pool = prior.new_pool()
    served = wrong = shadow = compared = reports = 0
    for item in stream:
        if item.score < prior.floor:
            continue
        entry = entries.get(item.entry) or prior.new_entry()
        learn = pool_learns = False
        if decide(prior, item.score, entry, pool, delta) == "serve":
            served += 1
            wrong += not item.right
            if rng.random() < label_rate:
                shadow += 1
                learn = pool_learns = True
            elif not item.right and rng.random() < client_report_rate:
                reports += 1
                learn = True  # a client's report teaches its own entry, never the pool
        elif rng.random() < compare:
            compared += 1
            learn = pool_learns = True
        if learn:
            entries[item.entry] = update_entry(prior, item.score, item.right, entry, pool)
        if pool_learns:
            pool = update_pool(prior, item.score, item.right, pool)
    learned = [s for s in entries.values() if s.seen]
    return {
        "delta": delta,
        "label_rate": label_rate,
        "compare_rate": compare,
        "client_report_rate": client_report_rate,
        "lookups": len(stream),
        "served": served,
        "wrong": wrong,
        "positives": positives,
        "error_rate": round(wrong / served, 4) if served else None,
        "error_rate_upper95": _r(wilson_upper(wrong, served)),
        "errors_per_lookup": round(wrong / len(stream), 5) if stream else None,
        "hit_rate": round(served / len(stream), 4) if stream else 0.0,
        "recall": round((served - wrong) / positives, 4) if positives else 0.0,
        "shadow_calls": shadow,
        "compared_misses": compared,
        "client_reports": reports,
        "entries_labelled": len(learned),
        "entries_labelled_twice": sum(s.seen >= 2 for s in learned),
        "pool_labels": pool.seen,
    }


def sum_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one setting (other label draws) summed into one row; rates of the sums."""
    keys = (
        "lookups",
        "served",
        "wrong",
        "positives",
        "shadow_calls",
        "compared_misses",
        "client_reports",
        "pool_labels",
    )
    total = {k: sum(r[k] for r in runs) for k in keys}
    served, wrong = total["served"], total["wrong"]
    return {
        **runs[0],
        **total,
        "runs": len(runs),
        "error_rate": round(wrong / served, 4) if served else None,
        "error_rate_upper95": _r(wilson_upper(wrong, served)),
        "hit_rate": round(served / total["lookups"], 4) if total["lookups"] else 0.0,
        "recall": round((served - wrong) / total["positives"], 4) if total["positives"] else 0.0,
        "errors_per_lookup": round(wrong / total["lookups"], 5) if total["lookups"] else None,
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def static_row(name: str, rule: str, served: int, wrong: int, lookups: int, positives: int) -> dict[str, Any]:
    """A baseline (a fixed cut, the rules, the learned verifier) in the same columns."""
    return {
        "method": name,
        "rule": rule,
        "served": served,
        "wrong": wrong,
        "lookups": lookups,
        "error_rate": round(wrong / served, 4) if served else None,
        "error_rate_upper95": _r(wilson_upper(wrong, served)),
        "hit_rate": round(served / lookups, 4) if lookups else 0.0,
        "recall": round((served - wrong) / positives, 4) if positives else 0.0,
    }


def format_table(rows: Sequence[dict[str, Any]], title: str) -> str:
    """The rows (``replay`` results with a ``method``, and ``static_row``s) as aligned text.
    ``worst``: the worst run's error where a row sums several runs (``worst_run_error``);
    ``met``: that (else the row's) error is within the row's delta."""
    lines = [
        title,
        f"{'method':44} {'delta':>5} {'served':>6} {'wrong':>5} {'err':>6} {'err95':>6} {'worst':>6} "
        f"{'hits':>6} {'recall':>6} {'shadow':>6} {'met':>4}",
    ]
    for r in rows:
        delta = r.get("delta")
        err = r["error_rate"]
        worst = r.get("worst_run_error", err)
        met = "-" if delta is None else "yes" if worst is None or worst <= delta else "no"
        lines.append(
            f"{r['method']:44} {'' if delta is None else f'{delta:.2f}':>5} {r['served']:>6} "
            f"{r['wrong']:>5} {_f(err)} {_f(r['error_rate_upper95'])} {_f(r.get('worst_run_error'))} "
            f"{r['hit_rate']:>6.3f} {r['recall']:>6.3f} {r.get('shadow_calls', ''):>6} {met:>4}"
        )
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value:>6.3f}"


def baseline_rows(
    queries: Sequence[str],
    candidates: Sequence[str],
    stream: Sequence[Lookup],
    positives: int,
    threshold: float,
    verifier: Any | None = None,
    precision_target: float = 0.90,
) -> list[dict[str, Any]]:
    """The static decisions on the same stream (query i against its candidate i): similarity
    alone at ``threshold``, + the rules (cache/verify/rules.py), and the learned verifier
    (cache/verify/learned.py: cosine prefilter, probability >= the target's threshold)."""
    n = len(stream)

    def row(name: str, rule: str, hit: Sequence[bool]) -> dict[str, Any]:
        served = sum(hit)
        wrong = sum(h and not s.right for h, s in zip(hit, stream, strict=True))
        return static_row(name, rule, served, wrong, n, positives)

    cut = [s.score >= threshold for s in stream]
    rows = [
        row("similarity alone", f"cosine >= {threshold}", cut),
        row(
            "+ rules (default)",
            f"cosine >= {threshold}, rules",
            [c and verify(q, t).ok for c, q, t in zip(cut, queries, candidates, strict=True)],
        ),
    ]
    if verifier is not None:
        p = verifier.threshold_for(precision_target)
        rows.append(
            row(
                f"learned verifier, target {precision_target}",
                f"cosine >= {verifier.min_cosine}, p >= {p:.4f}",
                [
                    s.score >= verifier.min_cosine and verifier.probability(q, t, s.score) >= p
                    for s, q, t in zip(stream, queries, candidates, strict=True)
                ],
            )
        )
    return rows


def labelled_stream(
    text_a: Sequence[str], text_b: Sequence[str], labels: Sequence[int], vectors: dict[str, Any]
) -> tuple[list[str], list[str], list[Lookup]]:
    """Labelled pairs as a stream, in file order: entry = text_a (pairs sharing it share the
    entry's state), query = text_b, score = their cosine, right = the label. Returns
    (queries, candidate texts, stream)."""
    stream = [
        Lookup(a, float(vectors[a] @ vectors[b]), bool(y)) for a, b, y in zip(text_a, text_b, labels, strict=True)
    ]
    return list(text_b), list(text_a), stream


def retrieval_stream(
    origins: Sequence[str], similars: Sequence[str], vectors: dict[str, Any]
) -> tuple[list[str], list[str], list[Lookup]]:
    """Positives-only pairs as a cache: every distinct origin stored, each similar text looked
    up in file order; the candidate is the nearest stored origin, right when its text is the
    query's own origin (an identical text stored twice counts as right, as
    bench/gptcache_compare.py counts it)."""
    import numpy as np

    distinct = list(dict.fromkeys(origins))
    matrix = np.stack([vectors[t] for t in distinct])
    queries, candidates, stream = [], [], []
    for origin, similar in zip(origins, similars, strict=True):
        sims = matrix @ vectors[similar]
        best = int(np.argmax(sims))
        queries.append(similar)
        candidates.append(distinct[best])
        stream.append(Lookup(distinct[best], float(sims[best]), distinct[best] == origin))
    return queries, candidates, stream

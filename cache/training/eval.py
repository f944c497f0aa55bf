"""Evaluation of the semantic match decision on labelled question pairs.

Two kinds of input (``load_pairs``):

- labelled pairs, a JSON list of ``{"text_a", "text_b", "label"}`` (label 1 = same meaning),
  as a file or inside a tar archive (the QQP set as shipped by GPTCache). Scored pair by pair: a
  pair is a hit when cosine similarity >= threshold and verification accepts it.
- positives only, a JSON list of ``{"origin", "similar"}`` (GPTCache's 999 paraphrases). Scored as
  a cache: every origin is stored in one scope, every similar text is looked up; a hit is correct
  when the entry served is its own origin, wrong otherwise (GPTCache's published counting).

For each threshold of a sweep: precision, recall, F1 and hit rate, with and without the
verification stage; plus the default operating point and embedding throughput.
"""

from __future__ import annotations

import json
import random
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.errors import PairsFormatError
from cache.semantic.index import ScopedIndex
from cache.training.splits import split_of
from cache.verify.features import feature_matrix
from cache.verify.learned import LearnedVerifier
from cache.verify.rules import select, verify

SWEEP = tuple(round(0.70 + 0.01 * i, 2) for i in range(30))


@dataclass(frozen=True)
class Pairs:
    """Loaded evaluation pairs; labels is None for a positives-only (origin/similar) set."""

    text_a: list[str]
    text_b: list[str]
    labels: list[int] | None


@dataclass(frozen=True)
class Point:
    """Quality at one threshold. precision is None when there was no hit to judge."""

    threshold: float
    precision: float | None
    recall: float
    f1: float
    hit_rate: float


def _read_json(path: Path) -> Any:
    try:
        if tarfile.is_tarfile(path):
            with tarfile.open(path) as archive:
                members = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".json")]
                if not members:
                    raise PairsFormatError(f"{path}: no .json file inside the archive")
                handle = archive.extractfile(members[0])
                assert handle is not None  # a regular file member always has a handle
                return json.load(handle)
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise PairsFormatError(f"{path}: line {exc.lineno}: not JSON: {exc.msg}") from exc
    except (OSError, tarfile.TarError, UnicodeDecodeError) as exc:
        raise PairsFormatError(f"{path}: cannot read: {exc}") from exc


def load_pairs(path: Path, sample: int | None = None, seed: int = 0) -> Pairs:
    """Read pairs (see module doc); ``sample`` keeps that many pairs drawn with ``seed``.

    Raises PairsFormatError naming the file, the item index and the field at fault.
    """
    data = _read_json(path)
    if not isinstance(data, list) or not data:
        raise PairsFormatError(f"{path}: expected a non-empty JSON list of pairs")
    labelled = isinstance(data[0], dict) and "text_a" in data[0]
    fields = ("text_a", "text_b", "label") if labelled else ("origin", "similar")
    if sample is not None and sample < len(data):
        picked = sorted(random.Random(seed).sample(range(len(data)), sample))
    else:
        picked = list(range(len(data)))
    a: list[str] = []
    b: list[str] = []
    labels: list[int] = []
    for i in picked:
        item = data[i]
        if not isinstance(item, dict):
            raise PairsFormatError(f"{path}: item {i}: expected an object with {', '.join(fields)}")
        for field in fields[:2]:
            if not isinstance(item.get(field), str):
                raise PairsFormatError(f"{path}: item {i}: field {field!r} must be a string")
        a.append(item[fields[0]])
        b.append(item[fields[1]])
        if labelled:
            label = item.get("label")
            if label not in (0, 1) or isinstance(label, bool):
                raise PairsFormatError(f"{path}: item {i}: field 'label' must be 0 or 1")
            labels.append(int(label))
    return Pairs(a, b, labels if labelled else None)


def _point(threshold: float, tp: int, fp: int, positives: int, total: int) -> Point:
    hits = tp + fp
    precision = tp / hits if hits else None
    recall = tp / positives if positives else 0.0
    p = precision or 0.0
    f1 = 2 * p * recall / (p + recall) if p + recall else 0.0
    return Point(threshold, _r(precision), round(recall, 4), round(f1, 4), round(hits / total, 4))


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def score_labelled(
    sims: np.ndarray, accepted: Sequence[bool], labels: Sequence[int], thresholds: Sequence[float]
) -> list[Point]:
    """Pairwise points: a hit is sim >= threshold (0 means 0) and accepted[i]."""
    lab = np.asarray(labels, dtype=bool)
    ok = np.asarray(accepted, dtype=bool)
    points = []
    for t in thresholds:
        hit = (sims >= t) & ok
        points.append(_point(t, int((hit & lab).sum()), int((hit & ~lab).sum()), int(lab.sum()), len(lab)))
    return points


def score_retrieval(
    origins: np.ndarray,
    queries: np.ndarray,
    texts_a: Sequence[str],
    texts_b: Sequence[str],
    thresholds: Sequence[float],
    verified: bool,
    candidates: int = 4,
    margin: float = 0.02,
) -> list[tuple[Point, Counter[str]]]:
    """Cache-style points for positives-only pairs: origins indexed in one scope; query i is
    served what the cache would serve (``select`` over its nearest candidates; without
    verification, the nearest one above the threshold); correct when it is origin i. Returns
    each point with counts correct/wrong/miss."""
    index = ScopedIndex(dim=origins.shape[1], max_entries=len(origins) + 1)
    for i, vector in enumerate(origins):
        index.add(str(i), "eval", vector, expires_at=float("inf"))
    neighbours = [index.search("eval", q, k=candidates) for q in queries]
    results = []
    for t in thresholds:
        counts: Counter[str] = Counter(correct=0, wrong=0, miss=0)
        for i, found in enumerate(neighbours):
            if verified:
                chosen, _ = select(texts_b[i], [(texts_a[int(n.entry_id)], n.similarity) for n in found], t, margin)
            else:
                chosen = 0 if found and found[0].similarity >= t else None
            served = None if chosen is None else found[chosen].entry_id
            counts["miss" if served is None else "correct" if served == str(i) else "wrong"] += 1
        n = len(queries)
        results.append((_point(t, counts["correct"], counts["wrong"], n, n), counts))
    return results


GPTCACHE_DEFAULT_COSINE = 0.60  # SearchDistanceEvaluation's default 0.8 = (1 + cos) / 2


def _stage_row(stage: str, rule: str, tp: int, fp: int, positives: int, total: int) -> dict[str, Any]:
    hits = tp + fp
    return {
        "stage": stage,
        "rule": rule,
        "precision": _r(tp / hits) if hits else None,
        "recall": round(tp / positives, 4) if positives else 0.0,
        "hit_rate": round(hits / total, 4),
        "correct": tp,
        "wrong": fp,
        "miss": total - hits,
    }


def stage_table(
    pairs: Pairs,
    va: np.ndarray,
    vb: np.ndarray,
    default_threshold: float,
    verifier: LearnedVerifier | None,
    precision_target: float,
) -> list[dict[str, Any]]:
    """Precision, recall and hit rate of each stage of the match decision on one set, side by
    side with GPTCache's default (cosine >= 0.60, no verification): similarity alone at the
    default threshold, + the rules, and the learned verifier (cosine prefilter + calibrated
    probability >= the precision target's threshold), plus similarity alone at the cosine that
    gives the learned verifier's recall (what a cosine cut alone would cost for as many hits).
    Labelled pairs are scored pair by pair, positives-only sets as a cache (``score_retrieval``)."""
    n = len(pairs.text_a)
    prob_threshold = verifier.threshold_for(precision_target) if verifier is not None else None
    rows: list[dict[str, Any]] = []
    if pairs.labels is not None:
        lab = np.asarray(pairs.labels, dtype=bool)
        sims = (va * vb).sum(axis=1)
        ok = np.array([verify(a, b).ok for a, b in zip(pairs.text_a, pairs.text_b, strict=True)])
        positives = int(lab.sum())

        def row(stage: str, rule: str, hit: np.ndarray) -> dict[str, Any]:
            return _stage_row(stage, rule, int((hit & lab).sum()), int((hit & ~lab).sum()), positives, n)

        rows.append(row("gptcache default", f"cosine >= {GPTCACHE_DEFAULT_COSINE}", sims >= GPTCACHE_DEFAULT_COSINE))
        rows.append(row("similarity alone", f"cosine >= {default_threshold}", sims >= default_threshold))
        rows.append(row("+ rules", f"cosine >= {default_threshold}, rules", (sims >= default_threshold) & ok))
        if verifier is not None and prob_threshold is not None:
            kept = sims >= verifier.min_cosine
            probs = np.zeros(n)
            if kept.any():
                rows_x = feature_matrix([(pairs.text_a[i], pairs.text_b[i]) for i in np.nonzero(kept)[0]], sims[kept])
                probs[kept] = verifier.probability_of_rows(rows_x)
            learned = kept & (probs >= prob_threshold) & ok  # the cache's "learned" stage: the rules veto
            rows.append(
                row(
                    "+ learned verifier",
                    f"cosine >= {verifier.min_cosine}, p >= {prob_threshold:.4f} (target {precision_target}), rules veto",
                    learned,
                )
            )
            rows.append(_same_recall(sims, lab, int((learned & lab).sum()), positives, n))
        return rows

    def run(stage: str, rule: str, choose: Callable[[int, list[Any]], int | None]) -> dict[str, Any]:
        counts = _retrieve(va, vb, choose)
        return _stage_row(stage, rule, counts["correct"], counts["wrong"], n, n)

    top = lambda cut: lambda i, found: 0 if found and found[0].similarity >= cut else None  # noqa: E731
    rows.append(run("gptcache default", f"cosine >= {GPTCACHE_DEFAULT_COSINE}", top(GPTCACHE_DEFAULT_COSINE)))
    rows.append(run("similarity alone", f"cosine >= {default_threshold}", top(default_threshold)))
    rows.append(
        run(
            "+ rules",
            f"cosine >= {default_threshold}, rules",
            lambda i, found: select(
                pairs.text_b[i], [(pairs.text_a[int(x.entry_id)], x.similarity) for x in found], default_threshold
            )[0],
        )
    )
    if verifier is not None and prob_threshold is not None:
        v, pt = verifier, prob_threshold
        rows.append(
            run(
                "+ learned verifier",
                f"cosine >= {v.min_cosine}, p >= {pt:.4f} (target {precision_target}), rules veto",
                lambda i, found: v.select(
                    pairs.text_b[i], [(pairs.text_a[int(x.entry_id)], x.similarity) for x in found], pt, vetoes=True
                )[0],
            )
        )
    return rows


def _same_recall(sims: np.ndarray, lab: np.ndarray, correct: int, positives: int, n: int) -> dict[str, Any]:
    """Similarity alone at the highest cosine cut that has at least ``correct`` true hits."""
    pos = np.sort(sims[lab])[::-1]
    cut = float(pos[correct - 1]) if 0 < correct <= len(pos) else 1.0
    hit = sims >= cut
    return _stage_row(
        "similarity alone, same recall",
        f"cosine >= {cut:.4f}",
        int((hit & lab).sum()),
        int((hit & ~lab).sum()),
        positives,
        n,
    )


def _retrieve(
    origins: np.ndarray, queries: np.ndarray, choose: Callable[[int, list[Any]], int | None], candidates: int = 4
) -> Counter[str]:
    index = ScopedIndex(dim=origins.shape[1], max_entries=len(origins) + 1)
    for i, vector in enumerate(origins):
        index.add(str(i), "eval", vector, expires_at=float("inf"))
    counts: Counter[str] = Counter(correct=0, wrong=0, miss=0)
    for i, q in enumerate(queries):
        found = index.search("eval", q, k=candidates)
        chosen = choose(i, found)
        served = None if chosen is None else found[chosen].entry_id
        counts["miss" if served is None else "correct" if served == str(i) else "wrong"] += 1
    return counts


def format_stages(rows: list[dict[str, Any]], source: str) -> str:
    """The stage table as aligned text."""
    lines = [
        f"{source}: stages of the match decision",
        f"{'stage':32} {'prec':>6} {'recall':>6} {'hits':>6} {'correct':>7} {'wrong':>6} {'miss':>6}  rule",
    ]
    for r in rows:
        lines.append(
            f"{r['stage']:32} {_f(r['precision'])} {r['recall']:>6.3f} {r['hit_rate']:>6.3f} "
            f"{r['correct']:>7} {r['wrong']:>6} {r['miss']:>6}  {r['rule']}"
        )
    return "\n".join(lines)


def filter_split(pairs: Pairs, split: str | None) -> Pairs:
    """Only the labelled pairs of one split (cache/training/splits.py); None or a positives-only set: all."""
    if split is None or pairs.labels is None:
        return pairs
    keep = [i for i, (a, b) in enumerate(zip(pairs.text_a, pairs.text_b, strict=True)) if split_of(a, b) == split]
    return Pairs([pairs.text_a[i] for i in keep], [pairs.text_b[i] for i in keep], [pairs.labels[i] for i in keep])


def best_recall_at(points: Sequence[Point], min_precision: float) -> Point | None:
    """The point with the highest recall whose precision is >= min_precision."""
    good = [p for p in points if p.precision is not None and p.precision >= min_precision]
    return max(good, key=lambda p: (p.recall, p.threshold)) if good else None


def run_eval(
    pairs: Pairs,
    encode: Callable[[list[str]], np.ndarray],
    default_threshold: float,
    extra_threshold: float | None = None,
    batch_size: int = 64,
    verifier: LearnedVerifier | None = None,
    precision_target: float = 0.95,
) -> dict[str, Any]:
    """Encode both sides in batches and score the sweep; returns the report as plain data
    (keys: sweep, sweep_without_verification, default, best_at_precision_0_90,
    embeddings_per_s, stages (``stage_table``), ...)."""
    texts = pairs.text_a + pairs.text_b
    started = time.perf_counter()
    vectors = np.concatenate([encode(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)])
    seconds = time.perf_counter() - started
    n = len(pairs.text_a)
    va, vb = vectors[:n], vectors[n:]
    thresholds = sorted({*SWEEP, default_threshold, *(() if extra_threshold is None else (extra_threshold,))})
    report: dict[str, Any] = {"pairs": n, "embeddings_per_s": round(len(texts) / seconds, 1)}
    if pairs.labels is not None:
        sims = (va * vb).sum(axis=1)
        verdicts = [verify(a, b) for a, b in zip(pairs.text_a, pairs.text_b, strict=True)]
        accepted = [v.ok for v in verdicts]
        with_v = score_labelled(sims, accepted, pairs.labels, thresholds)
        without = score_labelled(sims, [True] * n, pairs.labels, thresholds)
        report["kind"] = "labelled"
        report["positives"] = sum(pairs.labels)
        report["rejected_by_rule"] = dict(
            Counter(v.reason for v, s in zip(verdicts, sims, strict=True) if not v.ok and s >= default_threshold)
        )
        counts: dict[float, Counter[str]] = {}
    else:
        scored = score_retrieval(va, vb, pairs.text_a, pairs.text_b, thresholds, verified=True)
        with_v = [p for p, _ in scored]
        counts = {p.threshold: c for p, c in scored}
        without = [p for p, _ in score_retrieval(va, vb, pairs.text_a, pairs.text_b, thresholds, verified=False)]
        report["kind"] = "positives-only"
    report["sweep"] = [asdict(p) | _counts(counts, p.threshold) for p in with_v]
    report["sweep_without_verification"] = [asdict(p) for p in without]
    default = next(p for p in with_v if p.threshold == default_threshold)
    report["default"] = asdict(default) | _counts(counts, default_threshold)
    if extra_threshold is not None:
        report["requested"] = asdict(next(p for p in with_v if p.threshold == extra_threshold))
    best = best_recall_at(with_v, 0.90)
    best_raw = best_recall_at(without, 0.90)
    report["best_at_precision_0_90"] = asdict(best) if best else None
    report["best_at_precision_0_90_without_verification"] = asdict(best_raw) if best_raw else None
    report["stages"] = stage_table(pairs, va, vb, default_threshold, verifier, precision_target)
    return report


def _counts(counts: dict[float, Counter[str]], threshold: float) -> dict[str, int]:
    return dict(counts[threshold]) if threshold in counts else {}


def format_report(report: dict[str, Any], source: str) -> str:
    """The sweep as an aligned text table (verified and raw side by side)."""
    lines = [
        f"{source}: {report['pairs']} pairs ({report['kind']}), "
        f"embeddings/s {report['embeddings_per_s']} ({report.get('backend', '?')} encoder)",
        f"{'thr':>5} | {'prec':>6} {'recall':>6} {'f1':>6} {'hits':>6} | "
        f"{'prec':>6} {'recall':>6} {'f1':>6} {'hits':>6}  (verified | similarity only)",
    ]
    for p, q in zip(report["sweep"], report["sweep_without_verification"], strict=True):
        lines.append(
            f"{p['threshold']:>5.2f} | {_f(p['precision'])} {p['recall']:>6.3f} {p['f1']:>6.3f} "
            f"{p['hit_rate']:>6.3f} | {_f(q['precision'])} {q['recall']:>6.3f} {q['f1']:>6.3f} "
            f"{q['hit_rate']:>6.3f}"
        )
    d = report["default"]
    lines.append(
        f"default threshold {d['threshold']:.2f}: precision {_f(d['precision']).strip()} "
        f"recall {d['recall']:.3f} f1 {d['f1']:.3f} hit rate {d['hit_rate']:.3f}"
    )
    for key, label in (
        ("best_at_precision_0_90", "verified"),
        ("best_at_precision_0_90_without_verification", "similarity only"),
    ):
        best = report[key]
        lines.append(
            f"highest recall at precision >= 0.90 ({label}): "
            + (
                f"threshold {best['threshold']:.2f} precision {best['precision']:.3f} recall {best['recall']:.3f}"
                if best
                else "none"
            )
        )
    lines.append(format_stages(report["stages"], source))
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return f"{'-':>6}" if value is None else f"{value:>6.3f}"

"""Training of the learned verifier (``python -m cache train-verifier``).

Steps, all printed:

1. Read labelled pairs (QQP: ``../shared/data/cache-eval/qqp/similiar_qqp_full.tar.gz``) and
   put each in its fixed split (cache/training/splits.py: keyed hash of the pair id, 60/20/20). At most
   ``max_per_split`` pairs of each split are used, the first ones in file order (encoding every
   QQP text takes about an hour on this 2-core machine).
2. Encode every distinct text with the cache's embedder; vectors are kept in an ``.npz`` file
   outside the repository (``embed_cache``) so later runs and ``eval`` skip the work.
3. Keep the pairs whose cosine is >= ``min_cosine`` (the lookup's cheap prefilter: the model only
   ever sees such candidates) and compute ``pair_features``.
4. Fit on train: logistic regression and gradient-boosted trees (scikit-learn). The kind is
   chosen on the calibration split (highest recall at precision >= 0.95 there), never on test.
5. Platt-scale the chosen model on the calibration split; tabulate, for precision targets
   0.80..0.99, the smallest probability whose calibration precision's 95 % lower bound meets the
   target.
6. Report precision / recall / hit rate on the test split at each target (recall counts every
   positive of the split, also those below the prefilter), and write the JSON file.

scikit-learn is needed here only; serving reads the JSON (cache/verify/learned.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.training.eval import Pairs
from cache.training.splits import SEED, SPLITS, Split, split_of
from cache.verify.features import FEATURES, feature_matrix
from cache.verify.learned import FORMAT, LearnedVerifier, OperatingPoint, wilson_lower

TARGETS = tuple(round(0.80 + 0.01 * i, 2) for i in range(20))
# the trees may only learn these directions: a more similar pair is never less probable, a rule
# that fires or a number / name / negation that differs never makes it more probable (on the
# calibration split this also raised recall at precision 0.90 from 0.13 to 0.21)
MONOTONE = {
    "cosine": 1,
    "rule_negation": -1,
    "rule_number": -1,
    "rule_opposite": -1,
    "rule_direction": -1,
    "rule_entity": -1,
    "rules_any": -1,
    "number_diff": -1,
    "entity_diff": -1,
    "negation_diff": -1,
    "order_discordance": -1,
}


@dataclass
class SplitData:
    """Pairs of one split with their cosine and features (rows above the prefilter only)."""

    texts: list[tuple[str, str]]
    labels: np.ndarray  # bool, every pair of the split
    cosines: np.ndarray
    kept: np.ndarray  # bool: cosine >= min_cosine
    features: np.ndarray  # rows of the kept pairs


def split_pairs(pairs: Pairs, max_per_split: int | None, seed: int = SEED) -> dict[Split, list[int]]:
    """Indices of the pairs of each split (file order), at most ``max_per_split`` each."""
    assert pairs.labels is not None
    out: dict[Split, list[int]] = {s: [] for s in SPLITS}
    for i, (a, b) in enumerate(zip(pairs.text_a, pairs.text_b, strict=True)):
        chosen = out[split_of(a, b, seed)]
        if max_per_split is None or len(chosen) < max_per_split:
            chosen.append(i)
    return out


def with_extra(primary: Pairs, max_per_split: int | None, extra: Pairs) -> Pairs:
    """``extra``'s pairs, all of them, then ``primary``'s capped at ``max_per_split`` per split as
    ``split_pairs`` caps them: the cap stays a cap on the main set (QQP), whatever is added.
    Both must be labelled (ValueError otherwise)."""
    if primary.labels is None or extra.labels is None:
        raise ValueError("training needs labelled pairs ({text_a, text_b, label})")
    kept = sorted(i for chosen in split_pairs(primary, max_per_split).values() for i in chosen)
    return Pairs(
        extra.text_a + [primary.text_a[i] for i in kept],
        extra.text_b + [primary.text_b[i] for i in kept],
        extra.labels + [primary.labels[i] for i in kept],
    )


def _text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def embed_cached(
    texts: Sequence[str],
    encode: Callable[[list[str]], np.ndarray],
    cache: Path | None,
    tag: str,
    log: Callable[[str], None] = print,
    batch: int = 64,
) -> dict[str, np.ndarray]:
    """Vector of every text, encoding only those not in the ``cache`` file (an ``.npz`` of keys
    and vectors for one model, named by ``tag``), which is rewritten after every 2,048 new ones."""
    known: dict[str, np.ndarray] = {}
    if cache is not None and cache.exists():
        with np.load(cache, allow_pickle=False) as data:
            if str(data["tag"]) == tag:
                known = dict(zip(data["keys"].tolist(), data["vectors"], strict=True))
    wanted = list(dict.fromkeys(texts))
    todo = [t for t in wanted if _text_key(t) not in known]
    log(f"embeddings: {len(wanted) - len(todo)} of {len(wanted)} distinct texts cached, encoding {len(todo)}")
    started = time.perf_counter()
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        for text, vector in zip(chunk, encode(chunk), strict=True):
            known[_text_key(text)] = vector.astype(np.float32)
        done = start + len(chunk)
        if cache is not None and (done % 2048 < batch or done == len(todo)):
            _save(cache, known, tag)
            rate = done / (time.perf_counter() - started)
            log(f"  encoded {done}/{len(todo)} ({rate:.0f}/s)")
    return {t: known[_text_key(t)] for t in wanted}


def _save(cache: Path, known: dict[str, np.ndarray], tag: str) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, keys=np.array(list(known)), vectors=np.stack(list(known.values())), tag=np.array(tag))
    tmp.replace(cache)


def build_split(pairs: Pairs, indices: list[int], vectors: dict[str, np.ndarray], min_cosine: float) -> SplitData:
    """Cosine, prefilter mask and feature rows of the pairs ``indices``."""
    assert pairs.labels is not None
    texts = [(pairs.text_a[i], pairs.text_b[i]) for i in indices]
    labels = np.array([pairs.labels[i] for i in indices], dtype=bool)
    cosines = np.array([float(vectors[a] @ vectors[b]) for a, b in texts])
    kept = cosines >= min_cosine
    kept_texts = [t for t, k in zip(texts, kept, strict=True) if k]
    return SplitData(texts, labels, cosines, kept, feature_matrix(kept_texts, cosines[kept]))


def _export_trees(model: Any) -> dict[str, Any]:
    """HistGradientBoostingClassifier -> the ``trees`` kind of the verifier file."""
    trees = []
    for (predictor,) in model._predictors:  # binary classification: one tree per iteration
        nodes = predictor.nodes
        trees.append(
            {
                "feature": nodes["feature_idx"].astype(int).tolist(),
                "threshold": nodes["num_threshold"].astype(float).tolist(),
                "left": nodes["left"].astype(int).tolist(),
                "right": nodes["right"].astype(int).tolist(),
                "value": nodes["value"].astype(float).tolist(),
                "leaf": nodes["is_leaf"].astype(bool).tolist(),
            }
        )
    return {"kind": "trees", "baseline": float(np.ravel(model._baseline_prediction)[0]), "trees": trees}


def _export_logistic(model: Any, mean: np.ndarray, scale: np.ndarray) -> dict[str, Any]:
    return {
        "kind": "logistic",
        "weights": model.coef_[0].tolist(),
        "bias": float(model.intercept_[0]),
        "mean": mean.tolist(),
        "scale": scale.tolist(),
    }


def curve(
    scores: np.ndarray, labels_kept: np.ndarray, positives: int, total: int, targets: Sequence[float], lower: bool
) -> list[OperatingPoint]:
    """For each target, the smallest score threshold whose precision (95 % Wilson lower bound
    when ``lower``, else the point estimate) is >= the target, scanning from the top score down;
    the threshold is the score itself (hits are score >= threshold). Targets never reached are
    left out."""
    order = np.argsort(-scores, kind="stable")
    s, y = scores[order], labels_kept[order]
    tp = np.cumsum(y)
    n = np.arange(1, len(s) + 1)
    # only cut between distinct scores: a threshold admits every tie
    last_of_tie = np.r_[s[1:] != s[:-1], True]
    points = []
    for target in targets:
        best = None
        for k in np.nonzero(last_of_tie)[0]:
            prec = wilson_lower(int(tp[k]), int(n[k])) if lower else tp[k] / n[k]
            if prec >= target:
                best = k
        if best is not None:
            points.append(
                OperatingPoint(
                    target=target,
                    probability=float(s[best]),
                    precision=round(float(tp[best] / n[best]), 4),
                    precision_lower=round(wilson_lower(int(tp[best]), int(n[best])), 4),
                    recall=round(float(tp[best] / positives), 4) if positives else 0.0,
                    hit_rate=round(float(n[best] / total), 4),
                )
            )
    return points


def score_at(probs: np.ndarray, data: SplitData, threshold: float) -> dict[str, Any]:
    """Precision, recall and hit rate of the hits probs >= threshold over the whole split."""
    labels = data.labels[data.kept]
    hit = probs >= threshold
    tp, hits = int((hit & labels).sum()), int(hit.sum())
    positives = int(data.labels.sum())
    return {
        "precision": round(tp / hits, 4) if hits else None,
        "recall": round(tp / positives, 4) if positives else 0.0,
        "hit_rate": round(hits / len(data.labels), 4),
        "hits": hits,
        "correct": tp,
    }


def _recall_at(scores: np.ndarray, data: SplitData, target: float) -> float:
    points = curve(scores, data.labels[data.kept], int(data.labels.sum()), len(data.labels), [target], lower=False)
    return points[0].recall if points else 0.0


def train(
    pairs: Pairs,
    encode: Callable[[list[str]], np.ndarray],
    *,
    max_per_split: int | None,
    min_cosine: float,
    embed_cache: Path | None,
    embed_tag: str,
    source: str,
    log: Callable[[str], None] = print,
    kinds: Sequence[str] = ("logistic", "trees"),
) -> dict[str, Any]:
    """Run steps 1-6 of the module doc; returns the verifier file's content (a JSON object)."""
    from threadpoolctl import threadpool_limits

    # one thread: the fits take seconds, and OpenMP's waiting threads on a loaded 2-core
    # machine made a 300-row fit take 50 s instead of 2
    with threadpool_limits(limits=1):
        return _train(
            pairs,
            encode,
            max_per_split=max_per_split,
            min_cosine=min_cosine,
            embed_cache=embed_cache,
            embed_tag=embed_tag,
            source=source,
            log=log,
            kinds=kinds,
        )


def _train(
    pairs: Pairs,
    encode: Callable[[list[str]], np.ndarray],
    *,
    max_per_split: int | None,
    min_cosine: float,
    embed_cache: Path | None,
    embed_tag: str,
    source: str,
    log: Callable[[str], None],
    kinds: Sequence[str],
) -> dict[str, Any]:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    if pairs.labels is None:
        raise ValueError("training needs labelled pairs ({text_a, text_b, label})")
    indices = split_pairs(pairs, max_per_split)
    sizes = {s: len(v) for s, v in indices.items()}
    log(
        f"split (seed {SEED}, keyed BLAKE2b of the pair id, 60/20/20): "
        + ", ".join(f"{s} {n}" for s, n in sizes.items())
        + (f" (at most {max_per_split} each)" if max_per_split else "")
    )
    used = [i for s in SPLITS for i in indices[s]]
    vectors = embed_cached(
        [t for i in used for t in (pairs.text_a[i], pairs.text_b[i])], encode, embed_cache, embed_tag, log
    )
    data = {s: build_split(pairs, indices[s], vectors, min_cosine) for s in SPLITS}
    for s in SPLITS:
        d = data[s]
        log(
            f"  {s}: {len(d.labels)} pairs, {int(d.labels.sum())} duplicates, {int(d.kept.sum())} with cosine >= "
            f"{min_cosine} ({int(d.labels[d.kept].sum())} duplicates)"
        )
    train_d, cal_d = data["train"], data["calibration"]
    y_train = train_d.labels[train_d.kept]
    fitted: dict[str, tuple[Any, Callable[[np.ndarray], np.ndarray], dict[str, Any]]] = {}
    if "logistic" in kinds:
        mean = train_d.features.mean(axis=0)
        scale = train_d.features.std(axis=0)
        scale[scale == 0] = 1.0
        lr = LogisticRegression(C=1.0, max_iter=2000).fit((train_d.features - mean) / scale, y_train)
        fitted["logistic"] = (
            lr,
            lambda x, lr=lr, m=mean, sc=scale: lr.decision_function((x - m) / sc),
            _export_logistic(lr, mean, scale),
        )
    if "trees" in kinds:
        # shallow and few: the walk costs one numpy step per level (cache/verify/learned.py), and
        # 200 trees of depth 14 took 1.8 ms per lookup under load
        gb = HistGradientBoostingClassifier(
            max_iter=100,
            learning_rate=0.1,
            max_depth=4,
            max_leaf_nodes=15,
            min_samples_leaf=40,
            l2_regularization=1.0,
            monotonic_cst=[MONOTONE.get(f, 0) for f in FEATURES],
            early_stopping=False,
            random_state=0,
        ).fit(train_d.features, y_train)
        fitted["trees"] = (gb, gb.decision_function, _export_trees(gb))
    choice = {k: _recall_at(f(cal_d.features), cal_d, 0.95) for k, (_, f, _) in fitted.items()}
    kind = max(choice, key=lambda k: choice[k])
    log(
        "calibration split, recall at precision >= 0.95 (uncalibrated): "
        + ", ".join(f"{k} {v:.3f}" for k, v in choice.items())
        + f" -> {kind}"
    )
    _, raw_fn, exported = fitted[kind]
    raw_cal = raw_fn(cal_d.features)
    platt = LogisticRegression(C=1e6, max_iter=1000).fit(raw_cal[:, None], cal_d.labels[cal_d.kept])
    a, b = float(platt.coef_[0][0]), float(platt.intercept_[0])
    probs_cal = 1 / (1 + np.exp(-(a * raw_cal + b)))
    points = curve(probs_cal, cal_d.labels[cal_d.kept], int(cal_d.labels.sum()), len(cal_d.labels), TARGETS, lower=True)
    content: dict[str, Any] = {
        "format": FORMAT,
        "features": list(FEATURES),
        "model": exported,
        "platt": {"a": a, "b": b},
        "min_cosine": min_cosine,
        "thresholds": [asdict(p) for p in points],
        "trained_on": {
            "source": source,
            "embedder": embed_tag,
            "pairs_per_split": sizes,
            "kept_per_split": {s: int(data[s].kept.sum()) for s in SPLITS},
            "max_per_split": max_per_split,
            "kind_choice": choice,
        },
        "split": {
            "seed": SEED,
            "method": "blake2b(text_a U+001F text_b, key=seed) mod 100: <60 train, <80 calibration, else test",
        },
    }
    verifier = LearnedVerifier(content, "trained")
    test_d = data["test"]
    probs_test = verifier.probability_of_rows(test_d.features)
    # the file must give the scores training computed (same model, same calibration)
    expected = 1 / (1 + np.exp(-(a * raw_fn(test_d.features) + b)))
    if not np.allclose(probs_test, expected, atol=1e-9):
        raise AssertionError(
            f"exported verifier disagrees with the fitted model (max diff {np.abs(probs_test - expected).max():.3g})"
        )
    # rows and scores the file must reproduce (tests/cache/test_learned_verifier.py)
    sample = np.linspace(0, len(test_d.features) - 1, num=min(32, len(test_d.features))).astype(int)
    content["check"] = {"features": test_d.features[sample].tolist(), "probabilities": expected[sample].tolist()}
    metrics = []
    for p in points:
        row = {
            "target": p.target,
            "probability": round(p.probability, 6),
            "calibration": {
                "precision": p.precision,
                "precision_lower": p.precision_lower,
                "recall": p.recall,
                "hit_rate": p.hit_rate,
            },
            "test": score_at(probs_test, test_d, p.probability),
        }
        metrics.append(row)
    content["metrics"] = metrics
    log(
        f"{'target':>6} {'prob':>7} | {'calibration prec (lower) / recall':>34} | {'test prec / recall / hit rate':>30}"
    )
    for row in metrics:
        c, t = row["calibration"], row["test"]
        tp = "-" if t["precision"] is None else f"{t['precision']:.3f}"
        log(
            f"{row['target']:>6.2f} {row['probability']:>7.4f} | {c['precision']:>8.3f} ({c['precision_lower']:.3f}) / "
            f"{c['recall']:.3f}{'':>12} | {tp:>6} / {t['recall']:.3f} / {t['hit_rate']:.3f}"
        )
    return content

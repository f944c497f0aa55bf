"""The int8 encoder against fp32: how far its vectors move and whether the cache decides the same.

    python bench/embed_precision.py [--json PATH] [--max-qqp N]

Both encoders are the bundled all-MiniLM-L6-v2 on ONNX Runtime (cache/embed/onnx.py), "fp32" and
"int8" (``PROMPTEDGE_CACHE_EMBED_PRECISION``), loaded as the cache loads them. Sets:

- ``gptcache_999``: GPTCache's 999 paraphrases as a cache (``../shared/data/cache-eval``, MIT):
  every distinct origin stored in one scope, every paraphrase looked up among its
  ``semantic_candidates`` nearest origins; right when the entry served is its own origin;
- ``qqp_test``: the first N pairs of QQP's test split (cache/training/splits.py), pair by pair:
  a hit is the stage serving text_a's entry to text_b.

The stage is the cache's default (``CacheSettings()``: "learned", the learned verifier at its
precision target with the rules' vetoes; "rules" and "rules+learned" when set so), run by the
cache's own functions (cache/verify/learned.py and cache/verify/rules.py ``select``) on each
precision's cosines. Reported per set: cosine drift (|cos_int8 - cos_fp32| of the compared pairs, max and
mean, and the signed mean; each text's vector against its fp32 vector), hits / right / wrong /
precision per precision, and the decisions that differ (served by one and not the other, or
another entry), split by whether the changed answer was right. Also each encoder's CPU ms per
text, one text per call as a lone lookup encodes (median of 3 interleaved rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.embed.encoder import Encoder  # noqa: E402
from cache.embed.load import load_encoder  # noqa: E402
from cache.settings import CacheSettings  # noqa: E402
from cache.training.eval import filter_split, load_pairs  # noqa: E402
from cache.verify.rules import select  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
QQP = DATA / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz"
GPTCACHE = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
PRECISIONS = ("fp32", "int8")

# (text, cosine) candidates, most similar first -> index served or None
Decide = Callable[[str, list[tuple[str, float]]], int | None]


def default_stage(settings: CacheSettings) -> Decide:
    """The lookup's decision (cache/semantic/cache.py ``lookup``) for ``settings.verifier``,
    without a bound, on candidates above the default cosine threshold."""
    learned = settings.learned_verifier()
    floor = settings.base_threshold("")
    if settings.verifier == "rules+learned":
        assert learned is not None
        floor = learned[0].min_cosine

    def decide(query: str, cands: list[tuple[str, float]]) -> int | None:
        cands = [c for c in cands if c[1] >= floor]
        chosen = None
        if settings.verifier != "learned":
            chosen, _ = select(query, cands, settings.rules_threshold, settings.candidate_margin)
        if chosen is None and cands and learned is not None:
            verifier, probability = learned
            chosen, _ = verifier.select(query, cands, probability, settings.candidate_margin, vetoes=True)
        return chosen

    return decide


def encode_all(encoder: Encoder, texts: Sequence[str]) -> dict[str, np.ndarray]:
    unique = list(dict.fromkeys(texts))
    vectors = np.concatenate([encoder.encode(unique[i : i + 32]) for i in range(0, len(unique), 32)])
    return dict(zip(unique, vectors, strict=True))


def cache_decisions(
    origins: list[str], queries: list[str], vec: dict[str, np.ndarray], decide: Decide, k: int
) -> tuple[list[str | None], np.ndarray]:
    """Per query the stored text served (None: a miss), and the cosines of (query, its own origin)."""
    stored = list(dict.fromkeys(origins))
    matrix = np.stack([vec[t] for t in stored])
    served: list[str | None] = []
    for q in queries:
        sims = matrix @ vec[q]
        top = np.argsort(-sims, kind="stable")[:k]
        cands = [(stored[j], float(sims[j])) for j in top]
        chosen = decide(q, cands)
        served.append(None if chosen is None else cands[chosen][0])
    own = np.array([float(vec[o] @ vec[q]) for o, q in zip(origins, queries, strict=True)])
    return served, own


def pair_decisions(
    text_a: list[str], text_b: list[str], vec: dict[str, np.ndarray], decide: Decide
) -> tuple[list[str | None], np.ndarray]:
    """Per pair text_a when the stage serves it to text_b (else None), and the pairs' cosines."""
    cos = np.array([float(vec[a] @ vec[b]) for a, b in zip(text_a, text_b, strict=True)])
    served = [a if decide(b, [(a, float(c))]) == 0 else None for a, b, c in zip(text_a, text_b, cos, strict=True)]
    return served, cos


def compare(
    name: str,
    served: dict[str, list[str | None]],
    right: list[Callable[[str], bool]],
    cos: dict[str, np.ndarray],
    texts: Sequence[str],
    vecs: dict[str, dict[str, np.ndarray]],
) -> dict[str, Any]:
    """One set's row: drift, each precision's hits, and the decisions that differ."""
    out: dict[str, Any] = {"set": name, "lookups": len(right)}
    for p in PRECISIONS:
        hits = [s for s in served[p] if s is not None]
        ok = sum(1 for s, r in zip(served[p], right, strict=True) if s is not None and r(s))
        out[p] = {
            "hits": len(hits),
            "right": ok,
            "wrong": len(hits) - ok,
            "precision": round(ok / len(hits), 4) if hits else None,
            "hit_rate": round(len(hits) / len(right), 4),
        }
    changed = {"gained_right": 0, "gained_wrong": 0, "lost_right": 0, "lost_wrong": 0, "other_entry": 0}
    for a, b, r in zip(served["fp32"], served["int8"], right, strict=True):
        if a == b:
            continue
        if a is not None and b is not None:
            changed["other_entry"] += 1
        elif b is not None:
            changed["gained_right" if r(b) else "gained_wrong"] += 1
        else:
            assert a is not None
            changed["lost_right" if r(a) else "lost_wrong"] += 1
    out["differ"] = sum(changed.values())
    out["agreement"] = round(1 - out["differ"] / len(right), 4)
    out["changed"] = changed
    signed = cos["int8"] - cos["fp32"]
    shift = np.abs(signed)
    unique = list(dict.fromkeys(texts))
    per_text = np.array([float(vecs["int8"][t] @ vecs["fp32"][t]) for t in unique])
    out["pair_cosine_shift"] = {
        "max": round(float(shift.max()), 4),
        "mean": round(float(shift.mean()), 4),
        # below 0: int8's noise is independent per text, so it pulls similar pairs apart
        "mean_signed": round(float(signed.mean()), 4),
    }
    out["vector_cosine_to_fp32"] = {"min": round(float(per_text.min()), 4), "mean": round(float(per_text.mean()), 5)}
    return out


def cpu_ms_per_text(encoders: dict[str, Encoder], texts: list[str], rounds: int = 3) -> dict[str, float]:
    """Median over interleaved rounds of the process's CPU ms per text, one text per call."""
    costs: dict[str, list[float]] = {p: [] for p in encoders}
    for encoder in encoders.values():
        encoder.encode(texts[:4])
    for _ in range(rounds):
        for p, encoder in encoders.items():
            started = time.process_time()
            for t in texts:
                encoder.encode([t])
            costs[p].append(1000 * (time.process_time() - started) / len(texts))
    return {p: round(statistics.median(v), 2) for p, v in costs.items()}


def main(args: argparse.Namespace) -> dict[str, Any]:
    settings = CacheSettings()
    encoders = {
        p: load_encoder(
            settings.embedding_model, 1, "onnx", settings.onnx_cache_dir, settings.embedding_package, precision=p
        )
        for p in PRECISIONS
    }
    decide = default_stage(settings)
    gpt = json.loads(GPTCACHE.read_text())
    origins, queries = [p["origin"] for p in gpt], [p["similar"] for p in gpt]
    qqp = filter_split(load_pairs(QQP), "test")
    assert qqp.labels is not None
    n = min(args.max_qqp, len(qqp.text_a))
    qa, qb, labels = list(qqp.text_a[:n]), list(qqp.text_b[:n]), list(qqp.labels[:n])
    texts = origins + queries + qa + qb
    vecs = {p: encode_all(e, texts) for p, e in encoders.items()}
    print(f"  encoded {len(set(texts))} texts per precision, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    rows = []
    served, cos = {}, {}
    for p in PRECISIONS:
        served[p], cos[p] = cache_decisions(origins, queries, vecs[p], decide, settings.semantic_candidates)
    own = [lambda s, o=o: s == o for o in origins]
    rows.append(compare("gptcache_999", served, own, cos, origins + queries, vecs))
    for p in PRECISIONS:
        served[p], cos[p] = pair_decisions(qa, qb, vecs[p], decide)
    label = [lambda s, y=y: bool(y) for y in labels]
    row = compare("qqp_test", served, label, cos, qa + qb, vecs)
    row["positives"] = int(sum(labels))
    for p in PRECISIONS:
        row[p]["recall"] = round(row[p]["right"] / max(1, row["positives"]), 4)
    rows.append(row)
    cost = cpu_ms_per_text(encoders, queries[: args.cost_texts])
    return {
        "stage": f"{settings.verifier} (rules at cosine {settings.rules_threshold}, learned at precision "
        f"target {settings.learned_target()})",
        "rows": rows,
        "cpu_ms_per_text_one_by_one": cost,
        "cost_texts": min(args.cost_texts, len(queries)),
        "cpu_count": os.cpu_count(),
        "loadavg_1m_at_end": os.getloadavg()[0],
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"stage: {report['stage']}",
        f"{'set':13} {'lookups':>7} | {'fp32 hits':>9} {'wrong':>5} {'prec':>6} | {'int8 hits':>9} {'wrong':>5} "
        f"{'prec':>6} | {'differ':>6} {'agree':>6} | {'+right':>6} {'+wrong':>6} {'-right':>6} {'-wrong':>6} "
        f"{'other':>5} | {'|dcos| max':>10} {'mean':>6} {'signed':>7} | {'vec cos min':>11} {'mean':>7}",
    ]
    for r in report["rows"]:
        f, i, c = r["fp32"], r["int8"], r["changed"]
        lines.append(
            f"{r['set']:13} {r['lookups']:>7} | {f['hits']:>9} {f['wrong']:>5} {f['precision'] or 0:>6.3f} | "
            f"{i['hits']:>9} {i['wrong']:>5} {i['precision'] or 0:>6.3f} | {r['differ']:>6} {r['agreement']:>6.3f} | "
            f"{c['gained_right']:>6} {c['gained_wrong']:>6} {c['lost_right']:>6} {c['lost_wrong']:>6} "
            f"{c['other_entry']:>5} | {r['pair_cosine_shift']['max']:>10.4f} {r['pair_cosine_shift']['mean']:>6.4f} "
            f"{r['pair_cosine_shift']['mean_signed']:>+7.4f} | "
            f"{r['vector_cosine_to_fp32']['min']:>11.4f} {r['vector_cosine_to_fp32']['mean']:>7.4f}"
        )
    cost = report["cpu_ms_per_text_one_by_one"]
    lines.append(
        f"CPU ms per text, one per call ({report['cost_texts']} GPTCache paraphrases, median of 3 rounds): "
        + ", ".join(f"{p} {v}" for p, v in cost.items())
        + f" ({cost['fp32'] / max(cost['int8'], 1e-9):.2f}x)"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--max-qqp", type=int, default=5000, help="first N pairs of QQP's test split")
    parser.add_argument("--cost-texts", type=int, default=200, help="texts timed per encoder and round")
    arguments = parser.parse_args()
    result = main(arguments)
    print(table(result))
    print(f"load average (1 min) at the end: {result['loadavg_1m_at_end']:.1f} on {result['cpu_count']} CPUs")
    if arguments.json:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps(result, indent=2))

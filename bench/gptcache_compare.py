"""PromptEdge's semantic match against GPTCache on the same pairs with the same embeddings.

    PYTHONPATH=/path/to/gptcache python bench/gptcache_compare.py --pairs FILE \
        [--sample N] [--seed S] [--json PATH]

GPTCache is not a PromptEdge dependency: install it anywhere (``pip install --target DIR
gptcache cachetools sqlalchemy``) and put DIR on PYTHONPATH for this run only.

Cache setting for both: every distinct ``text_a`` (or ``origin``) is stored, every ``text_b``
(``similar``) is looked up; a hit is correct when it serves the query's own pair and the pair is
labelled the same (always, for positives-only files). Both use all-MiniLM-L6-v2 vectors computed
once. GPTCache runs its own code: SQLite + faiss data manager, ``SearchDistanceEvaluation``
(faiss squared L2 on unit vectors, score (4 - d) / 4 = (1 + cos) / 2, so its threshold t means
cosine >= 2t - 1), sized to hold every entry. PromptEdge: its ScopedIndex (4 candidates) and
``select`` (verification), as in the cache. QQP repeats questions across pairs, so a served
text that is neither the pair's own nor identical to the query counts wrong even when it means
the same: compare the systems with each other there, not with the pairwise curve.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.embed import load_encoder  # noqa: E402
from cache.eval import load_pairs  # noqa: E402
from cache.index import ScopedIndex  # noqa: E402
from cache.verify import select  # noqa: E402

OURS = (0.80, 0.85, 0.90, 0.93, 0.95, 0.96, 0.97, 0.98)
GPTCACHE = (0.70, 0.80, 0.90, 0.95, 0.975, 0.98, 0.99)


def tally(served: list[str | None], wanted: list[str], good: list[bool], queries: list[str]) -> dict[str, Any]:
    # correct: the query's own pair when labelled the same, or the very same text stored by
    # another pair (QQP repeats questions across pairs); any other served text counts wrong
    correct = sum(s is not None and ((s == w and g) or s == q)
                  for s, w, g, q in zip(served, wanted, good, queries, strict=True))
    hits = sum(s is not None for s in served)
    positives = sum(good)
    return {"correct": correct, "wrong": hits - correct, "miss": len(served) - hits,
            "precision": round(correct / hits, 4) if hits else None,
            "recall": round(correct / positives, 4) if positives else None}


def ours(stored: list[str], queries: list[str], vec: dict[str, np.ndarray], threshold: float,
         verified: bool) -> list[str | None]:
    index = ScopedIndex(dim=len(next(iter(vec.values()))), max_entries=len(stored) + 1)
    for i, text in enumerate(stored):
        index.add(str(i), "eval", vec[text], expires_at=float("inf"))
    served: list[str | None] = []
    for query in queries:
        found = index.search("eval", vec[query], k=4 if verified else 1)
        if verified:
            chosen, _ = select(query, [(stored[int(n.entry_id)], n.similarity) for n in found], threshold)
        else:
            chosen = 0 if found and found[0].similarity >= threshold else None
        served.append(None if chosen is None else stored[int(found[chosen].entry_id)])
    return served


def gptcache_runs(stored: list[str], queries: list[str], vec: dict[str, np.ndarray]) -> dict[float, list[str | None]]:
    from gptcache import Cache, Config
    from gptcache.adapter.api import get, put
    from gptcache.manager import CacheBase, VectorBase, get_data_manager
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation.distance import SearchDistanceEvaluation

    folder = tempfile.mkdtemp(prefix="gptcache-")
    cache = Cache()
    cache.init(
        pre_embedding_func=get_prompt,
        embedding_func=lambda text, **_: vec[text],
        data_manager=get_data_manager(CacheBase("sqlite", sql_url=f"sqlite:///{folder}/cache.db"),
                                      VectorBase("faiss", dimension=len(next(iter(vec.values()))),
                                                 index_path=f"{folder}/faiss.index"),
                                      max_size=len(stored) + 1),  # its default keeps 1,000 (LRU)
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=0.0),
    )
    for text in stored:
        put(text, text, cache_obj=cache)
    runs: dict[float, list[str | None]] = {}
    for threshold in GPTCACHE:
        cache.config.similarity_threshold = threshold
        runs[threshold] = [get(q, cache_obj=cache) for q in queries]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, required=True)
    parser.add_argument("--sample", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        import gptcache  # noqa: F401
    except ImportError:
        sys.exit("gptcache is not importable: pip install --target DIR gptcache cachetools sqlalchemy, "
                 "then PYTHONPATH=DIR")
    pairs = load_pairs(args.pairs, args.sample, args.seed)
    labels = pairs.labels or [1] * len(pairs.text_a)
    stored = list(dict.fromkeys(pairs.text_a))
    texts = list(dict.fromkeys(pairs.text_a + pairs.text_b))
    encoder = load_encoder()
    started = time.perf_counter()
    vectors = np.concatenate([encoder.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    encode_s = time.perf_counter() - started
    vec = dict(zip(texts, vectors, strict=True))
    good = [bool(label) for label in labels]
    rows: list[dict[str, Any]] = []
    for threshold in OURS:
        for verified in (True, False):
            served = ours(stored, pairs.text_b, vec, threshold, verified)
            rows.append({"system": "promptedge" if verified else "promptedge (similarity only)",
                         "threshold": threshold, "cosine": threshold,
                         **tally(served, pairs.text_a, good, pairs.text_b)})
    for threshold, served in gptcache_runs(stored, pairs.text_b, vec).items():
        rows.append({"system": "gptcache", "threshold": threshold, "cosine": round(2 * threshold - 1, 3),
                     **tally(served, pairs.text_a, good, pairs.text_b)})
    print(f"{args.pairs.name}: {len(pairs.text_b)} lookups over {len(stored)} stored, "
          f"{sum(good)} with a correct answer; all-MiniLM-L6-v2 at {len(texts) / encode_s:.0f} texts/s")
    print(f"{'system':30} {'thr':>6} {'cos':>6} {'correct':>8} {'wrong':>6} {'miss':>6} {'prec':>6} {'recall':>6}")
    for r in rows:
        prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
        print(f"{r['system']:30} {r['threshold']:>6.3f} {r['cosine']:>6.3f} {r['correct']:>8} {r['wrong']:>6} "
              f"{r['miss']:>6} {prec:>6} {r['recall']:>6.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pairs": str(args.pairs), "sample": args.sample, "seed": args.seed,
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

"""PromptEdge's semantic match against GPTCache on the same pairs with the same embeddings.

    PYTHONPATH=/path/to/gptcache python bench/gptcache_compare.py --pairs FILE \
        [--sample N] [--seed S] [--json PATH] [--multi-turn N]

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

``--multi-turn N``: instead, the multi-turn context set of ``cache/training/multiturn.py`` (N cases per
kind from labelled pairs) as a cache: every stored conversation is stored, every query
conversation looked up. GPTCache keys a conversation with its own pre-processing functions
(``last_content``, its default, and ``all_content``); PromptEdge with its semantic scope (the
conversation before the last user turn, exactly) and the last turn by meaning. A served answer
is correct when it is the query's own case labelled the same, or a case whose stored
conversation is the query's, message for message.
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

from cache.embed.load import load_encoder  # noqa: E402
from cache.semantic.index import ScopedIndex  # noqa: E402
from cache.training.eval import filter_split, load_pairs  # noqa: E402
from cache.verify.learned import LearnedVerifier, load_verifier  # noqa: E402
from cache.verify.rules import select  # noqa: E402

OURS = (0.80, 0.85, 0.90, 0.93, 0.95, 0.96, 0.97, 0.98)
TARGETS = (0.85, 0.90, 0.95, 0.97)  # the learned verifier's precision targets (those its file supports run)
GPTCACHE = (0.70, 0.80, 0.90, 0.95, 0.975, 0.98, 0.99)


def tally(served: list[str | None], wanted: list[str], good: list[bool], queries: list[str]) -> dict[str, Any]:
    # correct: the query's own pair when labelled the same, or the very same text stored by
    # another pair (QQP repeats questions across pairs); any other served text counts wrong
    correct = sum(
        s is not None and ((s == w and g) or s == q) for s, w, g, q in zip(served, wanted, good, queries, strict=True)
    )
    hits = sum(s is not None for s in served)
    positives = sum(good)
    return {
        "correct": correct,
        "wrong": hits - correct,
        "miss": len(served) - hits,
        "precision": round(correct / hits, 4) if hits else None,
        "recall": round(correct / positives, 4) if positives else None,
    }


def ours(
    stored: list[str],
    queries: list[str],
    vec: dict[str, np.ndarray],
    threshold: float,
    verified: bool,
    learned: LearnedVerifier | None = None,
) -> list[str | None]:
    """What PromptEdge serves each query: rules (``verified``) at a cosine ``threshold``, the
    nearest entry above it (not verified), or with ``learned`` the learned verifier, for which
    ``threshold`` is the probability threshold (its own cosine prefilter applies)."""
    index = ScopedIndex(dim=len(next(iter(vec.values()))), max_entries=len(stored) + 1)
    for i, text in enumerate(stored):
        index.add(str(i), "eval", vec[text], expires_at=float("inf"))
    served: list[str | None] = []
    for query in queries:
        found = index.search("eval", vec[query], k=4 if verified or learned else 1)
        if learned is not None:
            chosen, _ = learned.select(query, [(stored[int(n.entry_id)], n.similarity) for n in found], threshold)
        elif verified:
            chosen, _ = select(query, [(stored[int(n.entry_id)], n.similarity) for n in found], threshold)
        else:
            chosen = 0 if found and found[0].similarity >= threshold else None
        served.append(None if chosen is None else stored[int(found[chosen].entry_id)])
    return served


def gptcache_runs(
    stored: list[str], queries: list[str], vec: dict[str, np.ndarray], answers: list[str] | None = None
) -> dict[float, list[str | None]]:
    """What GPTCache serves each query at each threshold of ``GPTCACHE``: stored text i is put
    with ``answers[i]`` (default: itself)."""
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
        data_manager=get_data_manager(
            CacheBase("sqlite", sql_url=f"sqlite:///{folder}/cache.db"),
            VectorBase("faiss", dimension=len(next(iter(vec.values()))), index_path=f"{folder}/faiss.index"),
            max_size=len(stored) + 1,
        ),  # its default keeps 1,000 (LRU)
        similarity_evaluation=SearchDistanceEvaluation(),
        config=Config(similarity_threshold=0.0),
    )
    for text, answer in zip(stored, stored if answers is None else answers, strict=True):
        put(text, answer, cache_obj=cache)
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
    parser.add_argument(
        "--split",
        choices=("train", "calibration", "test"),
        help="labelled pairs: only this split of the learned verifier's (cache/training/splits.py)",
    )
    parser.add_argument("--verifier", type=Path, help="learned verifier file (default: the shipped one)")
    parser.add_argument("--without-gptcache", action="store_true", help="run PromptEdge's rows only")
    parser.add_argument(
        "--multi-turn",
        type=int,
        metavar="N",
        help="score the multi-turn context set (N cases per kind) as a cache instead",
    )
    args = parser.parse_args()
    try:
        import gptcache  # noqa: F401

        have_gptcache = True
    except ImportError:
        if not args.without_gptcache:
            sys.exit(
                "gptcache is not importable: pip install --target DIR gptcache cachetools sqlalchemy, "
                "then PYTHONPATH=DIR (or --without-gptcache for PromptEdge's rows only)"
            )
        have_gptcache = False
    pairs = load_pairs(args.pairs)
    if args.split and pairs.labels is not None:
        pairs = filter_split(pairs, args.split)
    if args.sample is not None and args.sample < len(pairs.text_a):
        import random

        keep = sorted(random.Random(args.seed).sample(range(len(pairs.text_a)), args.sample))
        pairs = type(pairs)(
            [pairs.text_a[i] for i in keep],
            [pairs.text_b[i] for i in keep],
            None if pairs.labels is None else [pairs.labels[i] for i in keep],
        )
    if args.multi_turn is not None:
        if pairs.labels is None or args.multi_turn < 1:
            sys.exit("--multi-turn needs labelled pairs {text_a, text_b, label} and N >= 1")
        multi_turn(pairs, args.multi_turn, args.seed, have_gptcache, args.verifier, args.json)
        return
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
            rows.append(
                {
                    "system": "promptedge" if verified else "promptedge (similarity only)",
                    "threshold": threshold,
                    "cosine": threshold,
                    **tally(served, pairs.text_a, good, pairs.text_b),
                }
            )
    verifier = load_verifier(args.verifier)
    for target in TARGETS:
        try:
            probability = verifier.threshold_for(target)
        except ValueError:
            continue  # above what the calibration supports
        served = ours(stored, pairs.text_b, vec, probability, True, verifier)
        rows.append(
            {
                "system": f"promptedge learned (target {target})",
                "threshold": probability,
                "cosine": verifier.min_cosine,
                **tally(served, pairs.text_a, good, pairs.text_b),
            }
        )
    for threshold, served in (gptcache_runs(stored, pairs.text_b, vec) if have_gptcache else {}).items():
        rows.append(
            {
                "system": "gptcache",
                "threshold": threshold,
                "cosine": round(2 * threshold - 1, 3),
                **tally(served, pairs.text_a, good, pairs.text_b),
            }
        )
    print(
        f"{args.pairs.name}: {len(pairs.text_b)} lookups over {len(stored)} stored, "
        f"{sum(good)} with a correct answer; all-MiniLM-L6-v2 at {len(texts) / encode_s:.0f} texts/s"
    )
    print(f"{'system':30} {'thr':>6} {'cos':>6} {'correct':>8} {'wrong':>6} {'miss':>6} {'prec':>6} {'recall':>6}")
    for r in rows:
        prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
        print(
            f"{r['system']:30} {r['threshold']:>6.3f} {r['cosine']:>6.3f} {r['correct']:>8} {r['wrong']:>6} "
            f"{r['miss']:>6} {prec:>6} {r['recall']:>6.3f}"
        )
    stages = stage_rows(rows)
    print("\nstages (one table): GPTCache's default, similarity alone, + rules, + learned verifier")
    for name, r in stages:
        prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
        hit_rate = (r["correct"] + r["wrong"]) / len(pairs.text_b)
        print(f"  {name:44} precision {prec:>6}  recall {r['recall']:.3f}  hit rate {hit_rate:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "pairs": str(args.pairs),
                    "sample": args.sample,
                    "seed": args.seed,
                    "split": args.split,
                    "rows": rows,
                    "stages": [{"stage": n, **r} for n, r in stages],
                },
                indent=2,
            )
        )


def multi_turn(
    pairs: Any, per_kind: int, seed: int, have_gptcache: bool, verifier_path: Path | None, json_path: Path | None
) -> None:
    """The multi-turn context set as a cache (module doc), each system's correct / wrong / miss
    per kind; prints a table, writes JSON."""
    from cache.training.multiturn import KINDS, all_content, build_cases, last_content
    from cache.training.multiturn import scope_of as scope

    cases = build_cases(pairs.text_a, pairs.text_b, pairs.labels, per_kind, seed)
    keyings: dict[str, Any] = {"last_content": last_content, "all_content": all_content}
    if have_gptcache:  # GPTCache's own functions (they take the request's data dict)
        from gptcache.processor.pre import all_content as g_all
        from gptcache.processor.pre import last_content as g_last

        keyings = {"last_content": lambda m: g_last({"messages": m}), "all_content": lambda m: g_all({"messages": m})}
    used = keyings.values() if have_gptcache else [last_content]  # PromptEdge's rows read the last turn only
    texts = sorted({key(conv) for c in cases for conv in (c.stored, c.query) for key in used})
    encoder = load_encoder()
    vectors = np.concatenate([encoder.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    vec = dict(zip(texts, vectors, strict=True))

    def right(i: int, served: str | None) -> bool:
        j = int(served) if served is not None else -1
        return (j == i and cases[i].label == 1) or (j >= 0 and cases[j].stored == cases[i].query)

    def tally_kinds(served: list[str | None]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for kind in (*KINDS, "all"):
            idx = [i for i, c in enumerate(cases) if kind in ("all", c.kind)]
            hits = [i for i in idx if served[i] is not None]
            correct = sum(right(i, served[i]) for i in hits)
            out[kind] = {"correct": correct, "wrong": len(hits) - correct, "miss": len(idx) - len(hits)}
        return out

    rows: list[dict[str, Any]] = []
    if have_gptcache:
        for name, key in keyings.items():
            stored_texts = [key(c.stored) for c in cases]
            runs = gptcache_runs(stored_texts, [key(c.query) for c in cases], vec, [str(i) for i in range(len(cases))])
            for threshold in (0.80, 0.98):  # its default, and cosine 0.96 (PromptEdge's default)
                rows.append({"system": f"gptcache {name}", "threshold": threshold, **tally_kinds(runs[threshold])})

    index = ScopedIndex(dim=vectors.shape[1], max_entries=len(cases) + 1)
    for i, c in enumerate(cases):
        if (q := scope(c.stored)) is not None:
            index.add(str(i), q.scope, vec[last_content(c.stored)], expires_at=float("inf"))
    verifier = load_verifier(verifier_path)
    probability = verifier.threshold_for(0.90)
    for name, choose in (
        (
            "promptedge + rules (0.96, the default)",
            lambda query, found: select(
                query, [(last_content(cases[int(n.entry_id)].stored), n.similarity) for n in found], 0.96
            )[0],
        ),
        (
            "promptedge + learned verifier (target 0.9)",
            lambda query, found: verifier.select(
                query, [(last_content(cases[int(n.entry_id)].stored), n.similarity) for n in found], probability
            )[0],
        ),
    ):
        served: list[str | None] = []
        for c in cases:
            q = scope(c.query)
            found = index.search(q.scope, vec[last_content(c.query)], k=4) if q is not None else []
            chosen = choose(last_content(c.query), found) if found else None
            served.append(None if chosen is None else found[chosen].entry_id)
        rows.append({"system": name, "threshold": None, **tally_kinds(served)})
    print(f"multi-turn context set: {len(cases)} cases ({per_kind} per kind), as a cache; correct / wrong / miss")
    print(f"{'system':44} {'thr':>5} " + " ".join(f"{k:>26}" for k in (*KINDS, "all")))
    for r in rows:
        thr = "" if r["threshold"] is None else f"{r['threshold']:.3f}"
        cells = " ".join(f"{r[k]['correct']:>8} /{r[k]['wrong']:>6} /{r[k]['miss']:>6}  " for k in (*KINDS, "all"))
        print(f"{r['system']:44} {thr:>5} {cells}")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {"multi_turn": {"per_kind": per_kind, "seed": seed, "cases": len(cases), "rows": rows}}, indent=2
            )
        )


def stage_rows(rows: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The rows of the stage table: GPTCache at its default (0.8), PromptEdge's similarity alone
    and + rules at its default 0.96, and the learned verifier at targets 0.90 and 0.85."""

    def find(system: str, threshold: float | None = None) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in rows
                if r["system"] == system and (threshold is None or abs(r["threshold"] - threshold) < 1e-9)
            ),
            None,
        )

    wanted = [
        ("gptcache default (0.80 = cosine 0.60)", find("gptcache", 0.80)),
        ("similarity alone (cosine 0.96)", find("promptedge (similarity only)", 0.96)),
        ("+ rules (cosine 0.96, the default)", find("promptedge", 0.96)),
        ("+ learned verifier (target 0.9)", find("promptedge learned (target 0.9)")),
        ("+ learned verifier (target 0.85)", find("promptedge learned (target 0.85)")),
    ]
    return [(name, r) for name, r in wanted if r is not None]


if __name__ == "__main__":
    main()

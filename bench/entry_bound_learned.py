"""The per-entry error bound on the learned verifier's calibrated probability (issue 34, item 2):
observed error against delta on held-out streams, beside the static stages.

    python bench/entry_bound_learned.py [--json PATH] [--embed-cache FILE.npz] [--multi-turn N]
        [--deltas 0.01,0.02,0.05] [--labels 0/0,0.1/1,1/1] [--seeds 5]

Streams (never used to fit the verifier or the prior), replayed in order by
cache/training/bound_eval.py's ``replay`` (the same decision and updates as the cache):

- ``gptcache_999``: every distinct origin stored; each paraphrase, in file order, is judged
  against its 4 nearest origins by the learned verifier down to the prior's floor (the first
  candidate in cosine order within the margin whose probability reaches the floor, as the cache
  does); the bound then decides on that probability. Right when the candidate is the
  paraphrase's own origin, wrong when it is another pair's (the negatives are the other pairs).
- ``multi_turn``: cache/training/multiturn.py's cases from QQP's test split; a case whose
  context differs is never a candidate (the scope: a miss); the others are judged on their
  last turns.

Label budgets SHADOW/COMPARE: the share of served hits shadow-verified / of explored misses
compared with the replica's answer (what teaches the entries and the pool). The prior is
``cache/models/entry_bound_learned.json`` unless ``--prior``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.training.bound_eval import Lookup, format_table, replay, static_row, sum_runs  # noqa: E402
from cache.training.eval import filter_split, load_pairs  # noqa: E402
from cache.training.multiturn import build_cases, last_content, scope_of  # noqa: E402
from cache.training.verifier import embed_cached  # noqa: E402
from cache.verify.bound.model import DEFAULT_LEARNED_PRIOR_PATH, BoundPrior, load_prior  # noqa: E402
from cache.verify.learned import LearnedVerifier, load_verifier  # noqa: E402
from cache.verify.rules import select  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
QQP = DATA / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz"
GPTCACHE = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
CANDIDATES = 4


def judged(
    verifier: LearnedVerifier, query: str, cands: list[tuple[str, float]], floor: float
) -> tuple[int | None, float]:
    """The learned verifier's choice down to ``floor`` and its probability (0 without one)."""
    chosen, _ = verifier.select(query, cands, floor)
    if chosen is None:
        return None, 0.0
    return chosen, verifier.probability(query, *cands[chosen])


def gptcache_stream(
    origins: list[str], similars: list[str], vec: dict[str, np.ndarray], verifier: LearnedVerifier, prior: BoundPrior
) -> tuple[list[Lookup], list[list[tuple[str, float]]], list[str]]:
    """The module doc's GPTCache stream, with each query's candidates and the wanted texts (for the static rows)."""
    stored = list(dict.fromkeys(origins))
    matrix = np.stack([vec[t] for t in stored])
    stream, all_cands = [], []
    for origin, similar in zip(origins, similars, strict=True):
        sims = matrix @ vec[similar]
        top = np.argsort(-sims, kind="stable")[:CANDIDATES]
        cands = [(stored[j], float(sims[j])) for j in top]
        all_cands.append(cands)
        chosen, p = judged(verifier, similar, cands, prior.floor)
        if chosen is None:
            stream.append(Lookup("", 0.0, False))
        else:
            stream.append(Lookup(cands[chosen][0], p, cands[chosen][0] == origin))
    return stream, all_cands, origins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--embed-cache", type=Path, default=None)
    parser.add_argument("--prior", type=Path, default=None)
    parser.add_argument("--multi-turn", type=int, default=1000, help="cases per kind")
    parser.add_argument("--deltas", default="0.01,0.02,0.05")
    parser.add_argument("--labels", default="0/0,0.1/1,1/1")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.90, help="the static learned row's precision target")
    args = parser.parse_args()

    from cache.cli import encoder_and_tag
    from cache.settings import CacheSettings

    started = time.perf_counter()
    verifier = load_verifier(None)
    prior = load_prior(args.prior or DEFAULT_LEARNED_PRIOR_PATH)
    if prior.kind != "learned":
        sys.exit(f"error: {prior.source} scores {prior.kind!r}, this bench needs a 'learned' prior")
    gpt = load_pairs(GPTCACHE)
    qqp = filter_split(load_pairs(QQP), "test")
    assert qqp.labels is not None
    cases = build_cases(qqp.text_a, qqp.text_b, qqp.labels, args.multi_turn, seed=0)
    texts = [*gpt.text_a, *gpt.text_b] + [last_content(conv) for c in cases for conv in (c.stored, c.query)]
    settings = CacheSettings()
    encoder, tag = encoder_and_tag(None, settings)
    vec = embed_cached(
        texts,
        encoder.encode,
        args.embed_cache,
        tag,
        log=lambda line: print(line, file=sys.stderr),
    )
    p_static = verifier.threshold_for(args.target)
    out: dict[str, Any] = {"prior": prior.source, "verifier": verifier.source, "sets": {}}
    # GPTCache
    stream, cands, wanted = gptcache_stream(gpt.text_a, gpt.text_b, vec, verifier, prior)
    n = len(stream)
    rows: list[dict[str, Any]] = []
    for label, hit_of in (
        ("rules, cosine 0.96", lambda q, c: select(q, c, 0.96)[0]),
        (f"learned, target {args.target}", lambda q, c: verifier.select(q, c, p_static)[0]),
    ):
        served = wrong = 0
        for q, c, w in zip(gpt.text_b, cands, wanted, strict=True):
            chosen = hit_of(q, c)
            if chosen is not None:
                served += 1
                wrong += c[chosen][0] != w
        rows.append(static_row(label, "static", served, wrong, n, n) | {"method": label})
    rows += _bound_rows(stream, prior, args, n)
    out["sets"]["gptcache_999"] = rows
    print(format_table(rows, f"GPTCache's 999 pairs as a cache (negatives: the other pairs), prior {prior.source}"))
    # multi-turn
    mt: list[Lookup] = []
    static_hits = {"rules, cosine 0.96": [0, 0], f"learned, target {args.target}": [0, 0]}
    positives = 0
    for c in cases:
        positives += c.label == 1
        s, q = scope_of(c.stored), scope_of(c.query)
        if s is None or q is None or s.scope != q.scope:
            mt.append(Lookup("", 0.0, False))
            continue
        a, b = last_content(c.stored), last_content(c.query)
        cand = [(a, float(vec[a] @ vec[b]))]
        for key, chosen in (
            ("rules, cosine 0.96", select(b, cand, 0.96)[0]),
            (f"learned, target {args.target}", verifier.select(b, cand, p_static)[0]),
        ):
            if chosen is not None:
                static_hits[key][0] += 1
                static_hits[key][1] += c.label != 1
        chosen, p = judged(verifier, b, cand, prior.floor)
        mt.append(Lookup(s.scope + "\x1f" + a, p, c.label == 1) if chosen is not None else Lookup("", 0.0, False))
    rows = [static_row(k, "static", v[0], v[1], len(mt), positives) | {"method": k} for k, v in static_hits.items()]
    rows += _bound_rows(mt, prior, args, positives)
    out["sets"]["multi_turn"] = rows
    print(format_table(rows, f"multi-turn set, {len(cases)} cases ({args.multi_turn} per kind, QQP test split)"))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


def _bound_rows(
    stream: list[Lookup], prior: BoundPrior, args: argparse.Namespace, positives: int
) -> list[dict[str, Any]]:
    rows = []
    for delta in (float(d) for d in args.deltas.split(",")):
        for budget in args.labels.split(","):
            shadow, compare = (float(r) for r in budget.split("/"))
            draws = 0 < shadow < 1 or 0 < compare < 1
            runs = [
                replay(stream, prior, delta, shadow, positives, 0.0, seed, compare)
                for seed in range(args.seeds if draws else 1)
            ]
            rows.append(sum_runs(runs) | {"method": f"bound on p, shadow {shadow:.0%}, compare {compare:.0%}"})
    return rows


if __name__ == "__main__":
    main()

"""The per-entry error bound on the learned verifier's calibrated probability (issue 34, item 2):
observed error against delta on held-out streams, beside the static stages.

    python bench/entry_bound_learned.py [--json PATH] [--embed-cache FILE.npz] [--multi-turn N]
        [--deltas 0.01,0.02,0.05] [--labels 0/1,0.1/1,1/1] [--seeds 5]
        [--prior STEPS.json] [--region-priors ONLINE.json,PUBLIC.json]

Bounds compared on the same streams: the "steps" prior (cache/models/entry_bound_learned.json,
QQP's calibration split; the state before issue 34's fix), and each "region" prior
(cache/verify/bound/model.py ``region_start``: a 95 % Clopper-Pearson bound on the error of
the served region; cache/models/entry_bound_region.json learns online only (a prior from the
public prior sets, ``fit-region-bound --public-dir``, is refused for the shipped verifier, which
is trained on them); "region-cp" is the
first with a one-look Clopper-Pearson bound, re-checked after every label, which is not valid
under that monitoring: shown for the difference). ``--seeds N``: run
0 replays the stream in file order, run s > 0 a permutation drawn with seed s (the label draws
use the same seed); rows sum the runs and give the worst run's error. "hindsight" rows: the
largest region [knot, 1] of the region prior's bins whose error over the whole stream is at
most delta (knowing every label: no online method can do better with these bins) and its
95 % upper bound; they show what the set allows.

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
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import random  # noqa: E402

from cache.training.bound_eval import Lookup, format_table, replay, static_row, sum_runs  # noqa: E402
from cache.training.eval import filter_split, load_pairs  # noqa: E402
from cache.training.multiturn import build_cases, last_content, scope_of  # noqa: E402
from cache.training.verifier import embed_cached  # noqa: E402
from cache.verify.bound.model import DEFAULT_PRIOR_PATH, BoundPrior, load_prior  # noqa: E402
from cache.verify.bound.region import clopper_pearson_upper  # noqa: E402
from cache.verify.learned import LearnedVerifier, load_verifier  # noqa: E402
from cache.verify.rules import select  # noqa: E402

DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
QQP = DATA / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz"
GPTCACHE = DATA / "cache-eval" / "gptcache-paraphrases" / "mock_data.json"
CANDIDATES = 4
MODELS = DEFAULT_PRIOR_PATH.parent
STEPS_PRIOR = MODELS / "entry_bound_learned.json"
REGION_PRIORS = f"{MODELS / 'entry_bound_region.json'}"


def judged(
    verifier: LearnedVerifier, query: str, cands: list[tuple[str, float]], floor: float
) -> tuple[int | None, float]:
    """The learned verifier's choice down to ``floor`` and its probability (0 without one): as
    the cache's "learned" stage with a bound (cache/semantic/cache.py), without the rules'
    vetoes, which made the bound's choice fall to another entry's candidate more often."""
    chosen, _ = verifier.select(query, cands, floor)
    if chosen is None:
        return None, 0.0
    return chosen, verifier.probability(query, *cands[chosen])


def gptcache_stream(
    origins: list[str], similars: list[str], vec: dict[str, np.ndarray], verifier: LearnedVerifier, floor: float
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
        chosen, p = judged(verifier, similar, cands, floor)
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
    parser.add_argument("--labels", default="0/1,0.1/1,1/1", help="shadow/compare shares, comma-separated")
    parser.add_argument("--no-cp-variant", action="store_true", help="no rows for the one-look CP variant")
    parser.add_argument("--region-priors", default=REGION_PRIORS, help="region-mode prior files, comma-separated")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.90, help="the static learned row's precision target")
    args = parser.parse_args()

    from cache.cli import encoder_and_tag
    from cache.settings import CacheSettings

    started = time.perf_counter()
    verifier = load_verifier(None)
    prior = load_prior(args.prior or STEPS_PRIOR)
    regions = [load_prior(Path(p)) for p in args.region_priors.split(",") if p]
    if regions and not args.no_cp_variant:
        # the first region prior with a one-look Clopper-Pearson bound re-checked after every label
        regions.insert(1, dataclasses.replace(regions[0], mode="region-cp", source="region-cp (one-look CP)"))
    for each in (prior, *regions):
        if each.kind != "learned":
            sys.exit(f"error: {each.source} scores {each.kind!r}, this bench needs a 'learned' prior")
    # the floor every bound searches down to: the lowest of the priors' (all 0.5 when shipped)
    floor = min(each.floor for each in (prior, *regions))
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
    out: dict[str, Any] = {
        "prior": prior.source,
        "region_priors": [r.source for r in regions],
        "verifier": verifier.source,
        "seeds": args.seeds,
        "sets": {},
    }
    # GPTCache
    stream, cands, wanted = gptcache_stream(gpt.text_a, gpt.text_b, vec, verifier, floor)
    n = len(stream)
    rows: list[dict[str, Any]] = []
    for label, hit_of in (
        ("rules, cosine 0.96", lambda q, c: select(q, c, 0.96)[0]),
        (f"learned + rules, target {args.target}", lambda q, c: verifier.select(q, c, p_static, vetoes=True)[0]),
    ):
        served = wrong = 0
        for q, c, w in zip(gpt.text_b, cands, wanted, strict=True):
            chosen = hit_of(q, c)
            if chosen is not None:
                served += 1
                wrong += c[chosen][0] != w
        rows.append(static_row(label, "static", served, wrong, n, n) | {"method": label})
    rows += _all_bound_rows(stream, prior, regions, args, n)
    out["sets"]["gptcache_999"] = rows
    print(format_table(rows, "GPTCache's 999 pairs as a cache (negatives: the other pairs)"))
    # multi-turn
    mt: list[Lookup] = []
    static_hits = {"rules, cosine 0.96": [0, 0], f"learned + rules, target {args.target}": [0, 0]}
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
            (f"learned + rules, target {args.target}", verifier.select(b, cand, p_static, vetoes=True)[0]),
        ):
            if chosen is not None:
                static_hits[key][0] += 1
                static_hits[key][1] += c.label != 1
        chosen, p = judged(verifier, b, cand, floor)
        mt.append(Lookup(s.scope + "\x1f" + a, p, c.label == 1) if chosen is not None else Lookup("", 0.0, False))
    rows = [static_row(k, "static", v[0], v[1], len(mt), positives) | {"method": k} for k, v in static_hits.items()]
    rows += _all_bound_rows(mt, prior, regions, args, positives)
    out["sets"]["multi_turn"] = rows
    print(format_table(rows, f"multi-turn set, {len(cases)} cases ({args.multi_turn} per kind, QQP test split)"))
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


def _all_bound_rows(
    stream: list[Lookup], steps: BoundPrior, regions: list[BoundPrior], args: argparse.Namespace, positives: int
) -> list[dict[str, Any]]:
    rows = _bound_rows(stream, steps, args, positives, "steps (QQP prior)")
    for region in regions:
        name = Path(region.source).stem.removeprefix("entry_bound_").split(" ")[0]
        rows += _bound_rows(stream, region, args, positives, name)
    if regions:
        rows += hindsight_rows(stream, regions[0], [float(d) for d in args.deltas.split(",")], positives)
    return rows


def _bound_rows(
    stream: list[Lookup], prior: BoundPrior, args: argparse.Namespace, positives: int, name: str
) -> list[dict[str, Any]]:
    rows = []
    for delta in (float(d) for d in args.deltas.split(",")):
        for budget in args.labels.split(","):
            shadow, compare = (float(r) for r in budget.split("/"))
            runs = [
                replay(_order(stream, seed), prior, delta, shadow, positives, 0.0, seed, compare)
                for seed in range(args.seeds)
            ]
            worst = max((r["error_rate"] for r in runs if r["error_rate"] is not None), default=None)
            rows.append(
                sum_runs(runs)
                | {"method": f"{name}, shadow {shadow:.0%}, compare {compare:.0%}", "worst_run_error": worst}
            )
    return rows


def _order(stream: list[Lookup], seed: int) -> list[Lookup]:
    """Run 0: the file's order; run s > 0: a permutation drawn with seed s."""
    if seed == 0:
        return stream
    shuffled = list(stream)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def hindsight_rows(
    stream: list[Lookup], prior: BoundPrior, deltas: list[float], positives: int
) -> list[dict[str, Any]]:
    """Per delta: the largest region [knot, 1] (the prior's bins) whose error over the whole
    stream is <= delta, knowing every label; its 95 % Clopper-Pearson upper bound says whether
    even all of the stream's labels could certify it."""
    rows = []
    for delta in deltas:
        best: tuple[int, int, float | None] = (0, 0, None)
        for knot in prior.knots:
            inside = [s for s in stream if s.score >= max(knot, prior.floor)]
            wrong = sum(not s.right for s in inside)
            if inside and wrong <= delta * len(inside) and len(inside) > best[0]:
                best = (len(inside), wrong, knot)
        served, wrong, best_knot = best
        row = static_row(f"hindsight region p >= {best_knot}", "hindsight", served, wrong, len(stream), positives)
        row |= {"delta": delta, "cp_upper95": round(clopper_pearson_upper(wrong, served), 4) if served else None}
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()

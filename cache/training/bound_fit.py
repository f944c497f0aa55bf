"""Offline fit of the per-entry bound's global prior (``python -m cache fit-bound``).

Input: scores (cosine of each labelled pair's two texts) and labels of the QQP *train* split
(cache/training/splits.py, the learned verifier's; calibration and test are never read here). Steps:

1. keep the pairs whose score is >= ``floor`` (the candidates a lookup can ever judge);
2. isotonic regression of the label on the score (scikit-learn's ``IsotonicRegression``,
   increasing): the precision of a cut can only grow with the score;
3. blocks of equal fitted value are joined with their upper neighbours until each holds at
   least ``min_step_pairs`` pairs; each becomes a step, its value replaced by the one-sided
   95 % Wilson lower bound of the block's share of positives (cache/verify/learned.py's
   ``wilson_lower``), then made non-decreasing again by a running maximum (under monotony, a
   higher block is at least as good as any lower one, so the lower one's bound holds for it):
   a block whose bound is no higher than the step below joins that step (fewer, wider steps
   gather a pool's labels faster);
4. its strength (pseudo-observations in the pool's Beta belief of the step) is the block's
   size, at most ``max_strength``.

scikit-learn is needed here only; serving reads the JSON (cache/verify/bound/model.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache.verify.bound.model import BoundPrior
from cache.verify.learned import wilson_lower

DEFAULT_FLOOR = 0.70  # the learned verifier's prefilter: below it no candidate is ever judged
# a step's training data counts as at most this many of the pool's own labels: QQP is a prior
# for other traffic, not its truth
DEFAULT_MAX_STRENGTH = 20.0
# a step holds at least this many training pairs: its 95 % lower bound is then within about
# 0.05-0.08 of its precision, and a pool's labels gather in fewer steps (chosen before any
# held-out run)
DEFAULT_MIN_STEP_PAIRS = 100


def fit_prior(
    scores: Sequence[float],
    labels: Sequence[int],
    floor: float = DEFAULT_FLOOR,
    offset_var: float = 1.0,
    max_strength: float = DEFAULT_MAX_STRENGTH,
    min_step_pairs: int = DEFAULT_MIN_STEP_PAIRS,
    kind: str = "cosine",
    source: str = "fitted",
) -> BoundPrior:
    """The prior's step function from labelled scores (see the module doc). Raises ValueError
    when no pair reaches ``floor``."""
    from sklearn.isotonic import IsotonicRegression

    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    keep = x >= floor
    if not keep.any():
        raise ValueError(f"no labelled pair has a score >= the floor {floor}")
    order = np.argsort(x[keep], kind="stable")
    xs, ys = x[keep][order], y[keep][order]
    fitted = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(xs, ys).predict(xs)
    # isotonic blocks as [first index, end index), then merged until each holds min_step_pairs
    edges = [0] + [i for i in range(1, len(xs)) if fitted[i] != fitted[i - 1]] + [len(xs)]
    blocks: list[list[int]] = []
    for lo, hi in zip(edges, edges[1:]):
        if blocks and blocks[-1][1] - blocks[-1][0] < min_step_pairs:
            blocks[-1][1] = hi
        else:
            blocks.append([lo, hi])
    if len(blocks) > 1 and blocks[-1][1] - blocks[-1][0] < min_step_pairs:
        blocks[-2][1] = blocks.pop()[1]
    knots: list[float] = []
    probability: list[float] = []
    sizes: list[int] = []
    for lo, hi in blocks:
        bound = wilson_lower(int(ys[lo:hi].sum()), hi - lo)
        # no better than the step below, or starting where it starts once rounded: one step with it
        if probability and (bound <= probability[-1] or round(float(xs[lo]), 6) <= round(knots[-1], 6)):
            sizes[-1] += hi - lo
        else:
            knots.append(floor if not knots else float(xs[lo]))
            probability.append(bound)
            sizes.append(hi - lo)
    return BoundPrior(
        kind,
        floor,
        tuple(round(k, 6) for k in knots),
        tuple(round(p, 6) for p in probability),
        tuple(float(min(n, max_strength)) for n in sizes),
        offset_var,
        source,
    )


# the "region" mode's bins over the learned verifier's probability (its floor 0.5 up): finer
# where hits are served, so a region can start close to where its error crosses delta
REGION_KNOTS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99)


def region_prior(
    scores: Sequence[float] = (),
    labels: Sequence[int] = (),
    knots: Sequence[float] = REGION_KNOTS,
    weight: float = 1.0,
    kind: str = "learned",
    source: str = "region",
) -> BoundPrior:
    """A "region" mode prior (cache/verify/bound/model.py ``region_start``) over ``knots``
    (the first is the floor). Without labelled pairs (default) every bin starts empty: the
    bound serves on the pool's own labels only. With them, each bin starts with ``weight``
    times its pairs as pseudo-labels (probability = the bin's share right, strength = weight *
    its pairs): the offline set then counts in the region's confidence bound as if observed in
    the pool, so it must be as clean as the pool's labels and from the same kind of traffic."""
    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    edges = np.asarray([*knots[1:], np.inf])
    probability, strength = [], []
    for lo, hi in zip(knots, edges, strict=True):
        inside = (x >= lo) & (x < hi)
        n = int(inside.sum())
        probability.append(round(float(y[inside].mean()), 6) if n else 0.0)
        strength.append(round(weight * n, 6))
    return BoundPrior(
        kind,
        float(knots[0]),
        tuple(float(k) for k in knots),
        tuple(probability),
        tuple(strength),
        1.0,
        source,
        "region",
    )

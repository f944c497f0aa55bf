"""Offline fit of the per-entry bound's global prior (``python -m cache fit-bound``).

Input: scores (cosine of each labelled pair's two texts) and labels of the QQP *train* split
(cache/splits.py, the learned verifier's; calibration and test are never read here). Steps:

1. keep the pairs whose score is >= ``floor`` (the candidates a lookup can ever judge);
2. isotonic regression of the label on the score (scikit-learn's ``IsotonicRegression``,
   increasing): the precision of a cut can only grow with the score;
3. each block of equal fitted value becomes a step; its value is replaced by the one-sided
   95 % Wilson lower bound of the block's share of positives (cache/verifier.py's
   ``wilson_lower``), then made non-decreasing again by a running maximum (under monotony, a
   higher block is at least as good as any lower one, so the lower one's bound holds for it).

scikit-learn is needed here only; serving reads the JSON (cache/entry_bound.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cache.entry_bound import BoundPrior
from cache.verifier import wilson_lower

DEFAULT_FLOOR = 0.70  # the learned verifier's prefilter: below it no candidate is ever judged


def fit_prior(scores: Sequence[float], labels: Sequence[int], floor: float = DEFAULT_FLOOR,
              offset_var: float = 1.0, pool_var: float = 0.25, kind: str = "cosine",
              source: str = "fitted") -> BoundPrior:
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
    knots: list[float] = []
    probability: list[float] = []
    start = 0
    for end in range(1, len(xs) + 1):
        if end == len(xs) or fitted[end] != fitted[start]:
            block = ys[start:end]
            bound = wilson_lower(int(block.sum()), len(block))
            knots.append(floor if not knots else float(xs[start]))
            probability.append(max(bound, probability[-1] if probability else 0.0))
            start = end
    return BoundPrior(kind, floor, tuple(round(k, 6) for k in knots), tuple(round(p, 6) for p in probability),
                      offset_var, pool_var, source)

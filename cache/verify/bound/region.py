"""The binomial confidence bound behind the per-entry bound's "region" mode (issue 34, item 2). Pure.

The question it answers: among ``total`` labelled observations of a served region, ``wrong``
were wrong; is the region's error rate at most ``delta`` with confidence ``1 - alpha``? That is:
is the one-sided Clopper-Pearson upper bound of the binomial proportion at most ``delta``?
The bound u solves ``P(Binomial(total, u) <= wrong) = alpha``; since that probability falls as
u grows, ``u <= delta`` exactly when ``P(Binomial(total, delta) <= wrong) <= alpha``, which is
``I_delta(wrong + 1, total - wrong) >= 1 - alpha`` (the regularized incomplete beta function):
one evaluation, no root search. Counts may be fractional (a prior's pseudo-labels).

Clopper-Pearson rather than Wilson: with no wrong label it needs ``log(alpha) / log(1 - delta)``
labels (299 at delta 0.01, alpha 0.05) where Wilson's one-sided bound needs 268, and Wilson's
coverage dips below its level for proportions near 0, the only ones served here.

The incomplete beta is the continued fraction of Numerical Recipes (``betacf``, modified Lentz);
scipy has it, but scipy is not a dependency of the serving path (pyproject's ``forecaster``
extra only), and this is one decision per lookup.
"""

from __future__ import annotations

import math

_FPMIN = 1e-300
_EPS = 1e-12
_MAX_ITER = 10_000


def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (Numerical Recipes 6.4, modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
    h = d
    for m in range(1, _MAX_ITER + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _FPMIN else _FPMIN)
            c = 1.0 + aa / c
            c = c if abs(c) > _FPMIN else _FPMIN
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function (the Beta(a, b) CDF at x), for
    a, b > 0 and x in [0, 1]; ValueError otherwise."""
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"regularized_beta needs a, b > 0 and 0 <= x <= 1, got {a}, {b}, {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(b, a, 1.0 - x) / b


def upper_bound_within(wrong: float, total: float, delta: float, alpha: float = 0.05) -> bool:
    """True when the one-sided (1 - alpha) Clopper-Pearson upper bound of ``wrong / total`` is
    at most ``delta`` (module doc). False without labels, when every label is wrong, or when
    the observed rate itself exceeds ``delta`` (the bound is never below it)."""
    if total <= 0 or wrong >= total or wrong > delta * total:
        return False
    if wrong <= 0 and total < math.log(alpha) / math.log1p(-delta):
        return False  # not enough labels even with none wrong: skip the series
    return regularized_beta(wrong + 1.0, total - wrong, delta) >= 1.0 - alpha


def clopper_pearson_upper(wrong: float, total: float, alpha: float = 0.05) -> float:
    """The one-sided (1 - alpha) Clopper-Pearson upper bound itself (bisection on
    ``upper_bound_within``; for reports, not the serving path); 1.0 without labels."""
    if total <= 0 or wrong >= total:
        return 1.0
    lo, hi = wrong / total, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (lo, mid) if upper_bound_within(wrong, total, mid, alpha) else (mid, hi)
    return hi


def mixture_evidence(wrong: float, total: float, delta: float) -> float:
    """log M: the evidence that a region's error rate is below ``delta``, anytime-valid.

    M = E_q[L(q) / L(delta)] with q uniform on [0, delta], L the likelihood of ``wrong`` wrong
    of ``total`` labels: ``B_delta(wrong + 1, total - wrong + 1) / (delta^(wrong+1) *
    (1 - delta)^(total - wrong))`` (B_x the incomplete beta). Where the true rate is >= delta,
    M is a nonnegative supermartingale in the labels (each factor has expectation <= 1), so
    by Ville's inequality it ever reaches 1/alpha with probability <= alpha, however often it
    is looked at. A Clopper-Pearson bound is valid for one look only: re-checked after every
    label, it certifies a region on an early lucky run (GPTCache's pairs, delta 0.02: one
    ordering served 27 hits with 2 wrong)."""
    a, b = wrong + 1.0, total - wrong + 1.0
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    tail = regularized_beta(a, b, delta)
    if tail <= 0.0:
        return -math.inf
    return math.log(tail) + log_beta - a * math.log(delta) - (total - wrong) * math.log1p(-delta)


def anytime_within(wrong: float, total: float, delta: float, alpha: float = 0.05) -> bool:
    """True when ``mixture_evidence`` reaches 1/alpha: the region's error is below ``delta``
    with confidence 1 - alpha, valid under continuous monitoring. False without labels or
    when the observed rate exceeds ``delta``."""
    if total <= 0 or wrong > delta * total:
        return False
    return mixture_evidence(wrong, total, delta) >= -math.log(alpha)

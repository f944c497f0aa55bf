"""A per-entry error bound for semantic hits, learned online (issue 14, item 2). Pure, apart
from ``load_prior`` and ``cached_prior`` (read the prior's file).

The question for every semantic candidate: may its cached answer be served to this query while
the share of wrong answers among served hits stays at most ``delta`` (e.g. 0.02)?

Model, for a query at score x (the cosine of the two texts) against entry e of a pool:

    P(right | x, e) = sigmoid(eta_pool(x) + b_e)

- ``eta_pool(x)``: the pool's calibration at the score, a step function of x. Its steps are
  fitted offline on labelled pairs (``BoundPrior``; QQP's train split, ``python -m cache
  fit-bound``, cache/training/bound_fit.py): isotonic regression of the label on the score, blocks of at
  least 100 pairs, each block's precision replaced by its one-sided 95 % Wilson lower bound. Online, every step is a Beta belief whose prior is
  that value with a bounded weight (``strength``, pseudo-observations) and which counts the
  pool's labelled right and wrong answers at that step (``PoolState``). So the calibration
  follows the pool's real traffic step by step: where it is cleaner than QQP the steps rise,
  where QQP's ceiling holds (label noise near 0.9 at the top) they stay; a shift learned at low
  scores never leaks to high ones.
- ``b_e``: the entry's own offset on the log-odds scale, with a Gaussian belief N(mean, var)
  (``EntryState``) that starts at N(0, offset_var) and moves with every labelled observation of
  that entry: an entry that served a wrong answer needs a higher score, one whose neighbours
  were right serves at a lower one.

Decision (``decide``): serve when the probability of a right answer is at least
``1 - delta``, that probability taken pessimistically where it is estimated and averaged where
it varies: the step's calibration at its one-sided 95 % lower bound (the Beta belief's log-odds
mean minus 1.645 standard deviations, ``CONFIDENCE_Z``), then averaged over the entry's belief
(probit approximation ``sigmoid(mu / sqrt(1 + pi * var / 8))``). Serving on the mean instead
held the rate only on average and broke it where a step's estimate happened to run high
(GPTCache's pairs, delta 0.05: 0.054 served error). So each served hit is wrong with
probability at most delta unless the pool's step is worse than its 95 % bound or the entry is
worse than its belief: the bound holds as far as those beliefs are calibrated, which the
lower-bounded prior makes conservative and the labels correct. A new entry's probability is
exactly its step's lower bound; with evidence of its own it moves up or down.

Updates: an entry learns from one labelled observation (``update_entry``) by one step of
Bayesian logistic regression with a Gaussian (Laplace) approximation: with p the probability
at the current means, ``var' = 1 / (1/var + p (1 - p))``, ``mean' = mean + var' (label - p)``;
a wrong answer where the model trusted the entry moves it far, a right one there little. The
pool counts the label at the score's step (``update_pool``); only labels the operator obtains
(shadow verification, compared misses) should reach the pool, a client's report only its own
entry (a client cannot make other tenants' hits rarer).

The "region" mode (issue 34, item 2; ``BoundPrior.mode``): the steps above, fitted on QQP,
never served at delta 1-2 % and served mostly wrong hits at 5 % on held-out sets, since QQP's
label noise caps its steps near 0.96 and a step's belief learned from mostly-right neighbours
then served wrong ones. In this mode the prior's knots are bins only; the pool counts its
labels per bin, and a candidate is served when its score lies in the pool's certified region:
the lowest bin from which up the labels give anytime-valid 95 % evidence that the error is
below delta (``region_start``, cache/verify/bound/region.py), and above every score at which
its own entry was labelled wrong (``EntryState.worst``). No model of P(right) is assumed; what
is served is vouched for by the labels the pool got on that very region.

States are a few numbers, JSON-serialisable (``to_json`` / ``from_json``): an entry's is stored
with the entry in Redis, a pool's under its own key. Units: scores as the prior's ``kind``
says (cosine: -1..1), probabilities 0..1, offsets and variances on the log-odds scale.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cache.errors import BoundError
from cache.verify.bound.region import anytime_within, upper_bound_within
from cache.verify.model_file import PerVersion, read_json

DEFAULT_PRIOR_PATH = Path(__file__).resolve().parents[2] / "models" / "entry_bound.json"  # cache/models/
# the prior on the learned verifier's calibrated probability (kind "learned", issue 34): the
# "region" mode, learning online only (entry_bound_learned.json, QQP's steps, served nothing at
# delta 1-2 % and mostly wrong hits at 5 %: docs/benchmarks.md, issue 34)
DEFAULT_LEARNED_PRIOR_PATH = DEFAULT_PRIOR_PATH.with_name("entry_bound_region.json")
FORMAT = "promptedge-entry-bound/1"
Decision = Literal["serve", "explore"]
# "region": anytime-valid evidence (region.py ``anytime_within``); "region-cp": a one-look
# Clopper-Pearson bound re-checked after every label (not valid under that monitoring: kept
# so the bench shows the difference)
MODES = ("steps", "region", "region-cp")
KINDS = ("cosine", "learned")  # what a prior's scores are (``BoundPrior.kind``)
_EPS = 1e-6  # probabilities are clipped to [eps, 1 - eps] before taking log-odds
_MIN_VAR = 1e-4  # a belief never becomes certain: the world may still change
CONFIDENCE_Z = 1.645  # a step's calibration is used at its one-sided 95 % lower bound


def sigmoid(z: float) -> float:
    """1 / (1 + exp(-z)), without overflow for large |z|."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def logit(p: float) -> float:
    """log(p / (1 - p)) of p clipped to [1e-6, 1 - 1e-6]."""
    p = min(max(p, _EPS), 1.0 - _EPS)
    return math.log(p / (1.0 - p))


def _spread(var: float) -> float:
    """The probit approximation's divisor: E[sigmoid(mu + N(0, var))] ~ sigmoid(mu / spread)."""
    return math.sqrt(1.0 + math.pi * var / 8.0)


@dataclass(frozen=True)
class EntryState:
    """Belief about one offset (an entry's ``b_e`` or a pool's ``g``) and its evidence.

    mean, var: the Gaussian belief, log-odds units. seen: labelled observations so far;
    wrong: of them, how many said the cached answer was wrong (counts for reports only).
    worst: the highest score at which the entry's answer was labelled wrong (the "region"
    mode's per-entry evidence: the entry serves only above it), None when never.
    """

    mean: float
    var: float
    seen: int = 0
    wrong: int = 0
    worst: float | None = None

    def to_json(self) -> dict[str, float | int]:
        """{"m": mean, "v": var, "n": seen, "w": wrong} and "x": worst when known: what is
        stored with the entry."""
        out: dict[str, float | int] = {
            "m": round(self.mean, 6),
            "v": round(self.var, 6),
            "n": self.seen,
            "w": self.wrong,
        }
        if self.worst is not None:
            out["x"] = round(self.worst, 6)
        return out

    @classmethod
    def from_json(cls, data: Any) -> EntryState:
        """The inverse of ``to_json``; raises BoundError for anything else (a corrupt field)."""
        try:
            mean, var, seen, wrong = float(data["m"]), float(data["v"]), int(data["n"]), int(data["w"])
            worst = None if data.get("x") is None else float(data["x"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BoundError(f"entry bound state: {exc.__class__.__name__}: {exc}") from None
        ok = math.isfinite(mean) and math.isfinite(var) and var > 0 and 0 <= wrong <= seen
        if not ok or (worst is not None and not math.isfinite(worst)):
            raise BoundError(f"entry bound state out of range: {data!r}")
        return cls(mean, var, seen, wrong, worst)


@dataclass(frozen=True)
class PoolState:
    """What a pool's labels said at each step of the prior: right and wrong answers counted
    per step (tuples as long as the prior's knots). Counts, so labels from several workers
    add up (in Redis: one HINCRBY per label)."""

    right: tuple[int, ...]
    wrong: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        """{"r": [...], "w": [...]}: what is stored under the pool's key."""
        return {"r": list(self.right), "w": list(self.wrong)}

    @classmethod
    def from_json(cls, data: Any, steps: int) -> PoolState:
        """The inverse of ``to_json`` for a prior of ``steps`` steps; BoundError otherwise."""
        try:
            right, wrong = tuple(int(x) for x in data["r"]), tuple(int(x) for x in data["w"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BoundError(f"pool bound state: {exc.__class__.__name__}: {exc}") from None
        if len(right) != steps or len(wrong) != steps or min(right + wrong, default=0) < 0:
            raise BoundError(f"pool bound state does not fit a prior of {steps} steps")
        return cls(right, wrong)

    @property
    def seen(self) -> int:
        """Labels counted so far."""
        return sum(self.right) + sum(self.wrong)


@dataclass(frozen=True)
class BoundPrior:
    """The global prior: a non-decreasing step function score -> calibrated P(right).

    kind: what the score is ("cosine": the two texts' cosine similarity; "learned": the learned
    verifier's calibrated probability, cache/verify/learned.py). floor: candidates
    below it are never served nor labelled. knots: strictly ascending scores where a step starts;
    probability[i]: the (lower-bounded) P(right) from knots[i] up to the next knot (below
    knots[0]: probability[0]); strength[i]: how many observations that value counts as in the
    step's Beta belief (the training block's size, capped: a pool's own labels outweigh it
    after that many). offset_var: the prior variance of an entry's offset (log-odds^2).
    source: where it was read or fitted. mode: how ``decide`` uses the pool's counts: "steps"
    (the Beta belief per step above) or "region" (``region_start``: a confidence bound on the
    error of the whole served region; the knots are then only the bins labels are counted in,
    and probability * strength the right pseudo-labels a bin starts with, the rest of its
    strength wrong ones). alpha: the region mode's error probability of its bound (0.05: a
    one-sided 95 % Clopper-Pearson upper bound). fitted_model: the embedder whose cosines the
    file was fitted on (its ``fitted_on.model``, e.g. "all-MiniLM-L6-v2|onnx"), None when it
    does not say (a prior that learns online only).

    Every field is checked at construction (finite numbers, the ranges above, equal lengths):
    BoundError naming ``source`` and the field otherwise.
    """

    kind: str
    floor: float
    knots: tuple[float, ...]
    probability: tuple[float, ...]
    strength: tuple[float, ...]
    offset_var: float = 1.0
    source: str = "prior"
    mode: str = "steps"
    alpha: float = 0.05
    fitted_model: str | None = field(default=None, compare=False)  # metadata, not the model

    def __post_init__(self) -> None:
        # every field is checked here, for every mode and kind: a value that passes is one
        # ``decide`` can compute with (an infinite strength made every region lookup raise
        # ValueError, NaN knots put every score in bin 0), so a bad file fails at start-up
        n = len(self.knots)
        if not n or len(self.probability) != n or len(self.strength) != n:
            raise BoundError(f"{self.source}: knots, probability and strength need the same, non-zero length")
        if self.kind not in KINDS:
            raise BoundError(f"{self.source}: kind must be one of {KINDS}, got {self.kind!r}")
        if not math.isfinite(self.floor):
            raise BoundError(f"{self.source}: floor must be a finite number, got {self.floor}")
        if not all(math.isfinite(k) for k in self.knots):
            raise BoundError(f"{self.source}: knots must be finite numbers")
        if any(lo >= hi for lo, hi in zip(self.knots, self.knots[1:])):
            raise BoundError(f"{self.source}: knots must be strictly increasing")
        if any(not 0.0 <= p <= 1.0 for p in self.probability):  # NaN fails the comparison too
            raise BoundError(f"{self.source}: probability must lie within 0..1")
        if self.mode == "steps" and list(self.probability) != sorted(self.probability):
            # a region prior's bins hold pseudo-label shares, which need not be monotone
            raise BoundError(f"{self.source}: probability must be non-decreasing within 0..1")
        if any(not (math.isfinite(w) and w >= 0) for w in self.strength):
            raise BoundError(f"{self.source}: strength must be finite and >= 0")
        if not (math.isfinite(self.offset_var) and self.offset_var > 0):
            raise BoundError(f"{self.source}: offset_var must be finite and > 0")
        if self.mode not in MODES:
            raise BoundError(f"{self.source}: mode must be one of {MODES}, got {self.mode!r}")
        if not 0.0 < self.alpha < 0.5:
            raise BoundError(f"{self.source}: alpha must lie within (0, 0.5)")

    def new_entry(self) -> EntryState:
        """The belief of an entry nothing is known about yet."""
        return EntryState(0.0, self.offset_var)

    def new_pool(self) -> PoolState:
        """A pool without labels: the prior's steps as they are."""
        zeros = (0,) * len(self.knots)
        return PoolState(zeros, zeros)

    def step(self, score: float) -> int:
        """Index of the step ``score`` falls in (scores below the first knot: 0)."""
        return max(bisect.bisect_right(self.knots, score) - 1, 0)

    def step_belief(self, i: int, pool: PoolState) -> tuple[float, float]:
        """Step i's Beta belief in the pool: (mean P(right), variance of its log-odds).

        Beta(a, b) with a = probability * strength + right + 1/2 and b likewise for wrong;
        the log-odds variance is about 1/a + 1/b."""
        q, w = self.probability[i], self.strength[i]
        a = q * w + pool.right[i] + 0.5
        b = (1.0 - q) * w + pool.wrong[i] + 0.5
        return a / (a + b), 1.0 / a + 1.0 / b

    def eta(self, score: float, pool: PoolState, z: float = 0.0) -> float:
        """The log-odds of the score's step in the pool, ``z`` standard deviations below its
        mean (0: the best estimate; ``CONFIDENCE_Z``: a one-sided 95 % lower bound), scaled so
        that a new entry's predictive probability is exactly sigmoid of it."""
        mean, var = self.step_belief(self.step(score), pool)
        return (logit(mean) - z * math.sqrt(var)) * _spread(self.offset_var)

    def to_json(self) -> dict[str, Any]:
        """The prior file's content (``load_prior`` reads it back)."""
        return {
            "format": FORMAT,
            "kind": self.kind,
            "floor": self.floor,
            "knots": list(self.knots),
            "probability": list(self.probability),
            "strength": list(self.strength),
            "offset_var": self.offset_var,
            "mode": self.mode,
            "alpha": self.alpha,
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "prior") -> BoundPrior:
        """Parse a prior file's content; raises BoundError naming ``source``."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BoundError(f"{source}: not a {FORMAT} file")
        try:
            return cls(
                str(data["kind"]),
                float(data["floor"]),
                tuple(float(k) for k in data["knots"]),
                tuple(float(p) for p in data["probability"]),
                tuple(float(w) for w in data["strength"]),
                float(data["offset_var"]),
                source,
                str(data.get("mode", "steps")),
                float(data.get("alpha", 0.05)),
                _fitted_model(data.get("fitted_on")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BoundError):
                raise
            raise BoundError(f"{source}: malformed: {exc.__class__.__name__}: {exc}") from None


def _fitted_model(fitted_on: Any) -> str | None:
    model = fitted_on.get("model") if isinstance(fitted_on, dict) else None
    return model if isinstance(model, str) and model else None


def predictive(prior: BoundPrior, score: float, entry: EntryState, pool: PoolState, z: float = CONFIDENCE_Z) -> float:
    """P(the entry's answer is right for a query at ``score``): the step's calibration at its
    lower bound (``z``; 0 for the best estimate), averaged over the entry's belief."""
    return sigmoid((prior.eta(score, pool, z) + entry.mean) / _spread(entry.var))


def region_start(prior: BoundPrior, pool: PoolState, delta: float) -> int:
    """The "region" mode's served region: the lowest bin i such that, among the pool's labels
    (with the prior's pseudo-labels) in bins i and above, the one-sided (1 - alpha)
    Clopper-Pearson upper bound of the share wrong is <= ``delta`` (cache/verify/bound/region.py);
    ``len(prior.knots)`` when no bin qualifies. Every bin from it up is served: the certificate
    is the region's, not a bin's, so a top bin with few labels serves on its region's evidence.
    A bin without labels starts no region (the labels above it would vouch for it); an
    empty bin inside a region is served with it.

    The labels stand for the region's traffic when the share labelled is the same across it,
    or, where it is not (every miss compared, a tenth of hits shadow-verified), when the
    better-labelled part is the lower one, whose error is the higher: then the bound is
    conservative. The evidence is anytime-valid (``anytime_within``), so re-checking it at
    every lookup costs no validity; choosing the lowest of the nested regions that pass is a
    multiple comparison the bound does not correct for (alpha split over the 13 shipped bins
    served 28 hits in 5 orderings of GPTCache's pairs at delta 0.05, against 1,248): the bench reports the observed error beside delta."""
    within = upper_bound_within if prior.mode == "region-cp" else anytime_within
    start = len(prior.knots)
    right = wrong = 0.0
    for i in reversed(range(len(prior.knots))):
        q, w = prior.probability[i], prior.strength[i]
        right += q * w + pool.right[i]
        wrong += (1.0 - q) * w + pool.wrong[i]
        # a bin without labels starts no region: the region above it would vouch for it
        if w + pool.right[i] + pool.wrong[i] > 0 and within(wrong, right + wrong, delta, prior.alpha):
            start = i
    return start


def decide(prior: BoundPrior, score: float, entry: EntryState, pool: PoolState, delta: float) -> Decision:
    """ "serve" when the predictive probability of a right answer is >= 1 - delta (and the
    score reaches the prior's floor), else "explore": treat as a miss; the replica's answer
    may then be compared with the cached one to label the entry.

    In the prior's "region" mode instead: "serve" when the score's bin lies in the pool's
    certified region (``region_start``) and the score is above every score at which this
    entry was labelled wrong (``EntryState.worst``)."""
    if score < prior.floor:
        return "explore"
    if prior.mode != "steps":
        if entry.worst is not None and score <= entry.worst:
            return "explore"
        return "serve" if prior.step(score) >= region_start(prior, pool, delta) else "explore"
    return "serve" if predictive(prior, score, entry, pool) >= 1.0 - delta else "explore"


def boundary(prior: BoundPrior, entry: EntryState, pool: PoolState, delta: float) -> float:
    """The lowest score served under ``delta`` at or above which every score is served (a
    knot of the prior, at least its floor); ``math.inf`` when the top step is not served.
    For reports; learned steps need not be monotone, so a lower step may serve too. In the
    "region" mode: the region's first knot, or just above the entry's worst wrong score."""
    if prior.mode != "steps":
        start = region_start(prior, pool, delta)
        if start == len(prior.knots):
            return math.inf
        edge = max(prior.knots[start], prior.floor)
        return edge if entry.worst is None or entry.worst < edge else math.nextafter(entry.worst, math.inf)
    edge = math.inf
    for knot in reversed(prior.knots):
        score = max(knot, prior.floor)
        if decide(prior, score, entry, pool, delta) != "serve":
            break
        edge = score
    return edge


def update_entry(prior: BoundPrior, score: float, right: bool, entry: EntryState, pool: PoolState) -> EntryState:
    """The entry's belief after one labelled observation: its cached answer was ``right`` (or
    not) for a query at ``score`` (the pool's calibration as it is). In the "region" mode only
    the counts and the highest wrong score change."""
    if prior.mode != "steps":
        worst = entry.worst if right or (entry.worst is not None and entry.worst >= score) else score
        return EntryState(entry.mean, entry.var, entry.seen + 1, entry.wrong + (not right), worst)
    p = sigmoid(prior.eta(score, pool) + entry.mean)
    var = max(1.0 / (1.0 / entry.var + p * (1.0 - p)), _MIN_VAR)
    return EntryState(entry.mean + var * (float(right) - p), var, entry.seen + 1, entry.wrong + (not right))


def update_pool(prior: BoundPrior, score: float, right: bool, pool: PoolState) -> PoolState:
    """The pool after one labelled observation at ``score``: counted at its step."""
    i = prior.step(score)
    if right:
        return PoolState(pool.right[:i] + (pool.right[i] + 1,) + pool.right[i + 1 :], pool.wrong)
    return PoolState(pool.right, pool.wrong[:i] + (pool.wrong[i] + 1,) + pool.wrong[i + 1 :])


def load_prior(path: Path | None = None) -> BoundPrior:
    """Read a prior file (default: the shipped ``cache/models/entry_bound.json``, fitted by
    ``python -m cache fit-bound``) with ``json.load``; raises BoundError naming the file."""
    path = path or DEFAULT_PRIOR_PATH
    return BoundPrior.from_json(read_json(path, "entry bound prior", BoundError), str(path))


_LOADED: PerVersion[BoundPrior] = PerVersion(load_prior, "entry bound prior", BoundError)


def cached_prior(path: Path | None = None) -> BoundPrior:
    """``load_prior`` once per file version (path, size, modification time) per process."""
    return _LOADED.get(path or DEFAULT_PRIOR_PATH)

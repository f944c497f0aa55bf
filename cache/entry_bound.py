"""A per-entry error bound for semantic hits, learned online (issue 14, item 2). Pure: math only.

The question for every semantic candidate: may its cached answer be served to this query while
the share of wrong answers among served hits stays at most ``delta`` (e.g. 0.02)?

Model. The probability that entry e's answer is right for a query at score x (the cosine of
the two texts, or another score that grows with the match) is

    P(right | x, e) = sigmoid(eta(x) + g + b_e)

- ``eta(x)``: the global prior, a non-decreasing step function of the score fitted offline on
  labelled pairs (``BoundPrior``; QQP's train split, ``python -m cache fit-bound``): isotonic
  regression of the labels on the score, each block's precision replaced by its one-sided 95 %
  Wilson lower bound, so a block of few pairs cannot look better than its data supports;
- ``b_e``: the entry's own offset on the log-odds scale, unknown, with a Gaussian belief
  N(mean, var) (``EntryState``) that starts at N(0, prior.offset_var) and moves with every
  labelled observation of that entry: an entry whose neighbours turned out right serves at a
  lower score, one that served a wrong answer needs a higher one;
- ``g``: the same kind of offset shared by every entry of a pool (``EntryState`` too), which
  corrects the prior where the traffic is not QQP.

Decision (``decide``). Serve when the *predictive* probability of a right answer, the model
averaged over what is not known about both offsets (probit approximation:
``sigmoid(mu / sqrt(1 + pi * s2 / 8))`` with mu = eta(x) + g_mean + b_mean and
s2 = g_var + b_var), is at least ``1 - delta``. Then every served hit is wrong with
probability at most delta given everything known when it was served, so the expected share of
wrong answers among served hits is at most delta: the bound is met when the model is
calibrated, which the offline lower bounds make conservative and the online offsets correct.
A new entry's belief is wide (var = offset_var), which pulls its predictive probability
towards 1/2: it serves only where the prior alone is clear, and earns a lower boundary with
evidence. ``eta`` is scaled so that a new entry in a pool without feedback reproduces the
prior's calibrated probability exactly.

Update (``update``): one labelled observation (score, right?) of an entry moves its belief by
one step of Bayesian logistic regression with a Gaussian (Laplace) approximation: with p the
predicted probability at the current means, ``var' = 1 / (1/var + p (1 - p))`` and
``mean' = mean + var' * (label - p)``. The entry and pool offsets are updated alike, each with
the other held at its mean (a diagonal approximation). A wrong answer at a score the model
trusted moves the mean far (p near 1: label - p near -1); a right one there moves it little.

State is a few numbers, JSON-serialisable (``EntryState.to_json`` / ``from_json``), stored
with the entry in Redis. ``load_prior`` is the one function that reads a file. Units: scores as the prior's ``kind`` says (cosine: -1..1),
probabilities 0..1, offsets and variances on the log-odds scale.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

DEFAULT_PRIOR_PATH = Path(__file__).resolve().parent / "models" / "entry_bound.json"
FORMAT = "promptedge-entry-bound/1"
Decision = Literal["serve", "explore"]
_EPS = 1e-6  # probabilities are clipped to [eps, 1 - eps] before taking log-odds
_MIN_VAR = 1e-4  # a belief never becomes certain: the world may still change


class BoundError(ValueError):
    """A prior file or a state that cannot be used; the message names the file or field."""


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
    """

    mean: float
    var: float
    seen: int = 0
    wrong: int = 0

    def to_json(self) -> dict[str, float | int]:
        """{"m": mean, "v": var, "n": seen, "w": wrong}: what is stored with the entry."""
        return {"m": round(self.mean, 6), "v": round(self.var, 6), "n": self.seen, "w": self.wrong}

    @classmethod
    def from_json(cls, data: Any) -> "EntryState":
        """The inverse of ``to_json``; raises BoundError for anything else (a corrupt field)."""
        try:
            mean, var, seen, wrong = float(data["m"]), float(data["v"]), int(data["n"]), int(data["w"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BoundError(f"entry bound state: {exc.__class__.__name__}: {exc}") from None
        if not (math.isfinite(mean) and math.isfinite(var) and var > 0 and 0 <= wrong <= seen):
            raise BoundError(f"entry bound state out of range: {data!r}")
        return cls(mean, var, seen, wrong)


@dataclass(frozen=True)
class BoundPrior:
    """The global prior: a non-decreasing step function score -> calibrated P(right).

    kind: what the score is ("cosine": the two texts' cosine similarity). floor: candidates
    below it are never served nor labelled. knots: ascending scores where a step starts;
    probability[i]: the (lower-bounded) P(right) from knots[i] up to the next knot; below
    knots[0] the probability is probability[0]. offset_var: the prior variance of an entry's
    offset (log-odds^2); pool_var: the same for a pool's. source: where it was fitted.
    """

    kind: str
    floor: float
    knots: tuple[float, ...]
    probability: tuple[float, ...]
    offset_var: float = 1.0
    pool_var: float = 0.25
    source: str = "prior"

    def __post_init__(self) -> None:
        if not self.knots or len(self.knots) != len(self.probability):
            raise BoundError(f"{self.source}: knots and probability need the same, non-zero length")
        if list(self.knots) != sorted(self.knots):
            raise BoundError(f"{self.source}: knots must be ascending")
        if any(not 0.0 <= p <= 1.0 for p in self.probability) or list(self.probability) != sorted(self.probability):
            raise BoundError(f"{self.source}: probability must be non-decreasing within 0..1")
        if not (self.offset_var > 0 and self.pool_var > 0):
            raise BoundError(f"{self.source}: offset_var and pool_var must be > 0")

    def new_entry(self) -> EntryState:
        """The belief of an entry nothing is known about yet."""
        return EntryState(0.0, self.offset_var)

    def new_pool(self) -> EntryState:
        """The belief of a pool nothing is known about yet."""
        return EntryState(0.0, self.pool_var)

    def eta(self, score: float) -> float:
        """The prior's log-odds at ``score``, scaled so that a new entry of a new pool has the
        calibrated probability ``probability_at(score)`` as its predictive probability."""
        return logit(self.probability_at(score)) * _spread(self.offset_var + self.pool_var)

    def probability_at(self, score: float) -> float:
        """The step function's calibrated P(right) at ``score``."""
        i = bisect.bisect_right(self.knots, score) - 1
        return self.probability[max(i, 0)]

    def to_json(self) -> dict[str, Any]:
        """The prior file's content (``load_prior`` reads it back)."""
        return {"format": FORMAT, "kind": self.kind, "floor": self.floor, "knots": list(self.knots),
                "probability": list(self.probability), "offset_var": self.offset_var,
                "pool_var": self.pool_var}

    @classmethod
    def from_json(cls, data: Any, source: str = "prior") -> "BoundPrior":
        """Parse a prior file's content; raises BoundError naming ``source``."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BoundError(f"{source}: not a {FORMAT} file")
        try:
            return cls(str(data["kind"]), float(data["floor"]), tuple(float(k) for k in data["knots"]),
                       tuple(float(p) for p in data["probability"]), float(data["offset_var"]),
                       float(data["pool_var"]), source)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, BoundError):
                raise
            raise BoundError(f"{source}: malformed: {exc.__class__.__name__}: {exc}") from None


def predictive(prior: BoundPrior, score: float, entry: EntryState, pool: EntryState) -> float:
    """P(the entry's answer is right for a query at ``score``), averaged over both beliefs."""
    mu = prior.eta(score) + pool.mean + entry.mean
    return sigmoid(mu / _spread(entry.var + pool.var))


def decide(prior: BoundPrior, score: float, entry: EntryState, pool: EntryState, delta: float) -> Decision:
    """"serve" when the predictive probability of a right answer is >= 1 - delta (and the
    score reaches the prior's floor), else "explore": treat as a miss; the replica's answer
    may then be compared with the cached one to label the entry."""
    if score < prior.floor:
        return "explore"
    return "serve" if predictive(prior, score, entry, pool) >= 1.0 - delta else "explore"


def boundary(prior: BoundPrior, entry: EntryState, pool: EntryState, delta: float) -> float:
    """The entry's decision boundary: the lowest score it is served at under ``delta`` (a
    knot of the prior, at least its floor), ``math.inf`` when no score reaches it. Equal to
    scanning ``decide`` over scores; for reports and for storing next to the entry."""
    for knot in prior.knots:
        score = max(knot, prior.floor)
        if decide(prior, score, entry, pool, delta) == "serve":
            return score
    return math.inf


def _step(state: EntryState, p: float, label: bool) -> EntryState:
    var = max(1.0 / (1.0 / state.var + p * (1.0 - p)), _MIN_VAR)
    return EntryState(state.mean + var * (float(label) - p), var, state.seen + 1, state.wrong + (not label))


def update(prior: BoundPrior, score: float, right: bool, entry: EntryState,
           pool: EntryState) -> tuple[EntryState, EntryState]:
    """The entry's and the pool's beliefs after one labelled observation: the cached answer
    was ``right`` (or not) for a query at ``score``. Returns (entry, pool)."""
    p = sigmoid(prior.eta(score) + pool.mean + entry.mean)
    return _step(entry, p, right), _step(pool, p, right)


def load_prior(path: Path | None = None) -> BoundPrior:
    """Read a prior file (default: the shipped ``cache/models/entry_bound.json``, fitted by
    ``python -m cache fit-bound``) with ``json.load``; raises BoundError naming the file."""
    path = path or DEFAULT_PRIOR_PATH
    try:
        with path.open(encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BoundError(f"cannot read the entry bound prior {path}: {exc}") from None
    return BoundPrior.from_json(data, str(path))

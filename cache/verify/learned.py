"""The learned verifier of semantic candidates: a small model over ``pair_features`` whose
calibrated probability that a cached text answers the query is compared with a threshold
chosen for a precision target.

The model is a JSON file (default ``cache/models/verifier.json``, written by
``python -m cache train-verifier``, cache/training/verifier.py): plain numbers, read with
``json.load``, so loading runs no code (a pickle would). Two model kinds:

- ``logistic``: ``raw = bias + weights . ((x - mean) / scale)``;
- ``trees``: gradient-boosted regression trees (scikit-learn's HistGradientBoostingClassifier
  exported node by node): ``raw = baseline + sum of one leaf value per tree``, a row going left
  at a node when ``x[feature] <= threshold``.

Then Platt scaling fitted on the calibration split: ``p = 1 / (1 + exp(-(a * raw + b)))``.
``thresholds`` maps precision targets to the smallest probability at which the calibration
split's precision (its one-sided 95 % Wilson lower bound, not the point estimate) still met the
target. A target between two rows takes the stricter row; a target above the last row is an
error (the calibration data cannot support it).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cache.errors import VerifierError
from cache.verify.features import FEATURES, pair_features
from cache.verify.model_file import PerVersion, read_json
from cache.verify.rules import verify

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "models" / "verifier.json"  # cache/models/
FORMAT = "promptedge-verifier/1"


@dataclass(frozen=True)
class OperatingPoint:
    """One row of the calibration table: at probability >= ``probability`` the calibration
    split had this precision (point estimate and 95 % lower bound), recall and hit rate."""

    target: float
    probability: float
    precision: float
    precision_lower: float
    recall: float
    hit_rate: float


class _Trees:
    """Boosted trees flattened into one node array, walked for all trees and rows at once: a
    leaf links to itself, so ``depth`` steps of four numpy operations reach every leaf."""

    def __init__(self, trees: list[dict[str, list[Any]]], n_features: int) -> None:
        feature: list[int] = []
        left: list[int] = []
        right: list[int] = []
        roots: list[int] = []
        threshold: list[float] = []
        value: list[float] = []
        depth = 0
        for i, t in enumerate(trees):
            n = len(t["feature"])
            for name in ("feature", "threshold", "left", "right", "value", "leaf"):
                if len(t[name]) != n:
                    raise VerifierError(f"tree {i}: field {name!r} has {len(t[name])} nodes, expected {n}")
            base = len(feature)
            roots.append(base)
            levels = [0] * n
            for j in range(n):
                if t["leaf"][j]:
                    feature.append(0)
                    threshold.append(0.0)
                    left.append(base + j)
                    right.append(base + j)
                else:
                    f, lo, hi = int(t["feature"][j]), int(t["left"][j]), int(t["right"][j])
                    # children after their parent: every walk ends, and levels are known in order
                    if not 0 <= f < n_features or not j < lo < n or not j < hi < n:
                        raise VerifierError(f"tree {i}: node {j} splits on feature {f} or links to {lo}/{hi}")
                    levels[lo] = levels[hi] = levels[j] + 1
                    feature.append(f)
                    threshold.append(float(t["threshold"][j]))
                    left.append(base + lo)
                    right.append(base + hi)
                value.append(float(t["value"][j]))
            depth = max(depth, max(levels))
        self.feature = np.asarray(feature, dtype=np.int64)
        self.threshold = np.asarray(threshold)
        self.left = np.asarray(left, dtype=np.int64)
        self.right = np.asarray(right, dtype=np.int64)
        self.value = np.asarray(value)
        self.roots = np.asarray(roots, dtype=np.int64)
        self.depth = depth

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Sum of leaf values per row of x (shape (n, features)) -> shape (n,)."""
        node = np.broadcast_to(self.roots, (len(x), len(self.roots)))
        samples = np.arange(len(x))[:, None]
        for _ in range(self.depth):
            go_left = x[samples, self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        sums: np.ndarray = self.value[node].sum(axis=1)
        return sums


class LearnedVerifier:
    """A loaded verifier file: ``probability`` of a pair, ``threshold_for`` a precision target.

    Build with ``load_verifier`` (or from the parsed JSON object, ``LearnedVerifier(data)``);
    raises VerifierError for a file of another format or feature list.
    """

    def __init__(self, data: dict[str, Any], source: str = "verifier") -> None:
        try:
            if data.get("format") != FORMAT:
                raise VerifierError(f"{source}: format {data.get('format')!r}, expected {FORMAT!r}")
            if tuple(data["features"]) != FEATURES:
                raise VerifierError(
                    f"{source}: its features {data['features']} are not this version's {list(FEATURES)}"
                )
            model = data["model"]
            self.kind = model["kind"]
            if self.kind == "logistic":
                self._weights = np.asarray(model["weights"], dtype=np.float64)
                self._mean = np.asarray(model["mean"], dtype=np.float64)
                self._scale = np.asarray(model["scale"], dtype=np.float64)
                self._bias = float(model["bias"])
                if not self._weights.shape == self._mean.shape == self._scale.shape == (len(FEATURES),):
                    raise VerifierError(f"{source}: weights, mean and scale need {len(FEATURES)} values each")
                self._trees: _Trees | None = None
            elif self.kind == "trees":
                self._trees = _Trees(model["trees"], len(FEATURES))
                self._bias = float(model["baseline"])
            else:
                raise VerifierError(f"{source}: unknown model kind {self.kind!r}")
            self._a = float(data["platt"]["a"])
            self._b = float(data["platt"]["b"])
            self.points = tuple(OperatingPoint(**row) for row in data["thresholds"])
            self.min_cosine = float(data["min_cosine"])
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, VerifierError):
                raise
            raise VerifierError(f"{source}: malformed verifier file: {exc.__class__.__name__}: {exc}") from exc
        if not self.points:
            raise VerifierError(f"{source}: no calibrated operating points")
        self.source = source
        self.meta = {k: data.get(k) for k in ("trained_on", "split", "metrics")}
        # the embedder whose cosines the file was trained on ("all-MiniLM-L6-v2|onnx"), None
        # when it does not say (older files, or a trained_on that is not an object)
        trained_on = data.get("trained_on")
        embedder = trained_on.get("embedder") if isinstance(trained_on, dict) else None
        self.trained_embedder: str | None = embedder if isinstance(embedder, str) and embedder else None

    def raw(self, x: np.ndarray) -> np.ndarray:
        """The model's uncalibrated score (log-odds) per feature row; x shape (n, features)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        if self._trees is not None:
            return self._bias + self._trees.raw(x)
        return self._bias + ((x - self._mean) / self._scale) @ self._weights

    def probability_of_rows(self, x: np.ndarray) -> np.ndarray:
        """Calibrated probability (0..1) that each pair means the same; shape (n,)."""
        z = self._a * self.raw(x) + self._b
        return 1.0 / (1.0 + np.exp(-np.clip(z, -500, 500)))

    def probability(self, query: str, candidate: str, cosine: float) -> float:
        """Calibrated probability (0..1) that ``candidate`` answers ``query``."""
        return float(self.probability_of_rows(pair_features(query, candidate, cosine)[None, :])[0])

    def threshold_for(self, target: float) -> float:
        """The probability threshold for a precision target (0..1): the calibration row of the
        smallest target >= ``target``. Raises VerifierError above the highest calibrated target."""
        for point in sorted(self.points, key=lambda p: p.target):
            if point.target >= target - 1e-12:
                return point.probability
        top = max(p.target for p in self.points)
        raise VerifierError(
            f"precision target {target} is above the highest this verifier was calibrated for ({top}; {self.source})"
        )

    def select(
        self,
        query: str,
        candidates: list[tuple[str, float]],
        probability: float,
        margin: float = 0.02,
        vetoes: bool = False,
        rejected: Counter[str] | None = None,
    ) -> tuple[int | None, float | None]:
        """Which candidate (text, cosine; most similar first) may answer ``query``: as the rules'
        ``select``, the first one in cosine order, within ``margin`` of the most similar one
        and with cosine >= ``min_cosine``, whose probability is >= ``probability`` (choosing
        the most probable one instead served other entries with more words in common but
        another meaning). With ``vetoes``, a candidate that a rule of cache/verify/rules.py
        vetoes (another number, a negation, another entity...) is skipped whatever its
        probability: the cache's "learned" stage (issue 34). ``rejected``, when given, counts
        each candidate judged before the choice and refused: under its rule's reason when
        vetoed, else ``learned``. Returns its index (or None) and the best probability seen
        (None without an eligible candidate). Pure but for ``rejected``."""
        if not candidates:
            return None, None
        best_cosine = candidates[0][1]
        eligible: list[int] = []
        for i, (text, cos) in enumerate(candidates):
            if cos < self.min_cosine or cos < best_cosine - margin:
                continue
            verdict = verify(query, text) if vetoes else None
            if verdict is not None and not verdict.ok:
                if rejected is not None:
                    rejected[verdict.reason] += 1
                continue
            eligible.append(i)
        if not eligible:
            return None, None
        rows = np.stack([pair_features(query, candidates[i][0], candidates[i][1]) for i in eligible])
        probs = self.probability_of_rows(rows)
        for i, p in zip(eligible, probs, strict=True):
            if p >= probability:
                return i, float(probs.max())
            if rejected is not None:
                rejected["learned"] += 1
        return None, float(probs.max())


def load_verifier(path: Path | None = None) -> LearnedVerifier:
    """Read a verifier file (default: the shipped ``cache/models/verifier.json``) with
    ``json.load``; raises VerifierError naming the file when it is missing or malformed."""
    path = path or DEFAULT_PATH
    data = read_json(path, "verifier file", VerifierError)
    if not isinstance(data, dict):
        raise VerifierError(f"{path}: expected a JSON object")
    return LearnedVerifier(data, str(path))


_LOADED: PerVersion[LearnedVerifier] = PerVersion(load_verifier, "verifier file", VerifierError)


def cached_verifier(path: Path | None = None) -> LearnedVerifier:
    """``load_verifier`` once per file version (path, size, modification time) per process."""
    return _LOADED.get(path or DEFAULT_PATH)


def wilson_lower(successes: int, total: int, z: float = 1.645) -> float:
    """One-sided lower confidence bound (95 % for z = 1.645) of a binomial proportion."""
    if total == 0:
        return 0.0
    p = successes / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    return (centre - spread) / (1 + z * z / total)

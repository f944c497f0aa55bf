"""A bound prior file is checked field by field when it is read (issue 34 adversarial round).

Before: a region prior with an infinite strength (or NaN knots or floor) loaded, the settings
accepted it at start, and then every bounded semantic lookup raised ValueError from
cache/verify/bound/region.py (HTTP 500). Now such a file is a BoundError naming the file and the
field, which the settings turn into a start-up error; the steps-mode (learned) and cosine priors
go through the same checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cache import CacheSettings
from cache.errors import BoundError
from cache.verify.bound.model import DEFAULT_LEARNED_PRIOR_PATH, DEFAULT_PRIOR_PATH, BoundPrior

STEPS_LEARNED_PRIOR_PATH = DEFAULT_PRIOR_PATH.with_name("entry_bound_learned.json")


def _prior(tmp_path: Path, shipped: Path = DEFAULT_LEARNED_PRIOR_PATH, **changes: Any) -> Path:
    data = json.loads(shipped.read_text())
    data.update(changes)
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(data))  # json writes Infinity / NaN, json.load reads them back
    return path


def _length(shipped: Path) -> int:
    return len(json.loads(shipped.read_text())["knots"])


BAD_FIELDS = [
    ("strength", lambda n: {"strength": [float("inf")] * n, "probability": [1.0] * n}),
    ("strength", lambda n: {"strength": [float("inf")] * n, "probability": [0.5] * n}),
    ("strength", lambda n: {"strength": [-1.0] * n}),
    ("knots", lambda n: {"knots": [float("nan")] * n}),
    ("knots", lambda n: {"knots": [0.5] * n}),  # not increasing
    ("knots", lambda n: {"knots": [float("inf")] + [0.5 + i / 100 for i in range(n - 1)]}),
    ("floor", lambda n: {"floor": float("nan")}),
    ("floor", lambda n: {"floor": float("-inf")}),
    ("probability", lambda n: {"probability": [1.5] * n}),
    ("probability", lambda n: {"probability": [float("nan")] * n}),
    ("offset_var", lambda n: {"offset_var": float("inf")}),
    ("alpha", lambda n: {"alpha": float("nan")}),
    ("kind", lambda n: {"kind": "euclidean"}),
]


@pytest.mark.parametrize("shipped", [DEFAULT_LEARNED_PRIOR_PATH, STEPS_LEARNED_PRIOR_PATH, DEFAULT_PRIOR_PATH])
@pytest.mark.parametrize(("field", "changes"), BAD_FIELDS)
def test_bad_prior_field_is_refused_at_load_naming_file_and_field(
    tmp_path: Path, shipped: Path, field: str, changes: Any
) -> None:
    path = _prior(tmp_path, shipped, **changes(_length(shipped)))
    with pytest.raises(BoundError, match=field) as caught:
        BoundPrior.from_json(json.loads(path.read_text()), str(path))
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("shipped", [DEFAULT_LEARNED_PRIOR_PATH, STEPS_LEARNED_PRIOR_PATH, DEFAULT_PRIOR_PATH])
def test_shipped_priors_pass_the_checks(shipped: Path) -> None:
    BoundPrior.from_json(json.loads(shipped.read_text()), str(shipped))


def test_infinite_strength_prior_is_a_start_up_error(tmp_path: Path) -> None:
    # before the fix the settings accepted this file and every lookup then raised ValueError
    path = _prior(tmp_path, strength=[float("inf")] * 13, probability=[1.0] * 13)
    with pytest.raises(ValueError, match="strength") as caught:
        CacheSettings(verifier="learned", error_bound=0.05, bound_prior_path=path)
    assert str(path) in str(caught.value)

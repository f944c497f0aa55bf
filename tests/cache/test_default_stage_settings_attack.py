"""Attack round on the default stage's settings (issue 34; branch attack2): a start-up error
names the setting the operator set, not one they left at its default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cache.settings import CacheSettings


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        # VERIFIER is left at its default ("learned"): only the target was set, so the error
        # must say PROMPTEDGE_CACHE_SEMANTIC_PRECISION_TARGET; it says
        # "PROMPTEDGE_CACHE_VERIFIER=learned: precision target 0.98 is above the highest ..."
        ({"semantic_precision_target": 0.98}, "PROMPTEDGE_CACHE_SEMANTIC_PRECISION_TARGET"),
        ({"verifier": "rules+learned", "rescue_precision_target": 0.98}, "PROMPTEDGE_CACHE_RESCUE_PRECISION_TARGET"),
    ],
)
def test_an_unreachable_precision_target_names_its_own_setting(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CacheSettings(**overrides)
    assert named in str(caught.value)

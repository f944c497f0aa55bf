"""The per-entry bound's "region" mode (issue 34, item 2): a candidate is served only inside the
region the pool's labels vouch for, with anytime-valid evidence that its error is below delta.
Fast: synthetic counts and streams, no model."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from cache.errors import BoundError
from cache.training.bound_eval import Lookup, replay
from cache.training.bound_fit import region_prior
from cache.verify.bound.model import (
    DEFAULT_LEARNED_PRIOR_PATH,
    BoundPrior,
    EntryState,
    PoolState,
    boundary,
    decide,
    load_prior,
    region_start,
    update_entry,
    update_pool,
)
from cache.verify.bound.region import anytime_within, clopper_pearson_upper, regularized_beta, upper_bound_within

# three bins over the learned verifier's probability, no pseudo-labels: the pool learns online
REGION = region_prior(knots=(0.5, 0.8, 0.9), source="test")
NEW = REGION.new_entry()


def pool_of(right: tuple[int, int, int], wrong: tuple[int, int, int]) -> PoolState:
    return PoolState(right, wrong)


def test_a_new_pool_serves_nothing_at_any_delta() -> None:
    for delta in (0.01, 0.02, 0.05, 0.5):
        for score in (0.5, 0.85, 0.99, 1.0):
            assert decide(REGION, score, NEW, REGION.new_pool(), delta) == "explore"
    assert boundary(REGION, NEW, REGION.new_pool(), 0.05) == math.inf


def test_serves_once_the_regions_labels_vouch_for_delta_and_not_one_label_before() -> None:
    # with none wrong, anytime-valid 95 % evidence of an error below 5 % needs 88 labels
    assert not anytime_within(0, 87, 0.05) and anytime_within(0, 88, 0.05)
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 87), (0, 0, 0)), 0.05) == "explore"
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 88), (0, 0, 0)), 0.05) == "serve"
    # the same labels do not vouch for 2 %
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 88), (0, 0, 0)), 0.02) == "explore"
    # one wrong label: more right ones are needed
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 100), (0, 0, 1)), 0.05) == "explore"
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 140), (0, 0, 1)), 0.05) == "serve"
    # an observed error above delta never serves, however many labels
    assert decide(REGION, 0.95, NEW, pool_of((0, 0, 9000), (0, 0, 1000)), 0.05) == "explore"


def test_the_region_starts_where_its_labels_stop_vouching() -> None:
    # bin 0.9 is clean; bin 0.8 holds many wrong labels: its region (0.8 up) fails, 0.9 up serves
    pool = pool_of((0, 100, 200), (0, 40, 0))
    assert region_start(REGION, pool, 0.05) == 2
    assert decide(REGION, 0.95, NEW, pool, 0.05) == "serve"
    assert decide(REGION, 0.85, NEW, pool, 0.05) == "explore"
    assert decide(REGION, 0.4, NEW, pool, 0.05) == "explore"  # below the floor
    assert boundary(REGION, NEW, pool, 0.05) == 0.9
    # bin 0.8 clean too: the region grows down to it
    pool = pool_of((0, 100, 200), (0, 0, 0))
    assert region_start(REGION, pool, 0.05) == 1 and decide(REGION, 0.85, NEW, pool, 0.05) == "serve"


def test_a_bin_without_labels_is_not_vouched_for_by_the_bins_above_it() -> None:
    pool = pool_of((0, 0, 300), (0, 0, 0))
    assert region_start(REGION, pool, 0.05) == 2
    assert decide(REGION, 0.85, NEW, pool, 0.05) == "explore"


def test_an_entry_labelled_wrong_serves_only_above_that_score() -> None:
    pool = pool_of((0, 300, 300), (0, 0, 0))
    entry = update_entry(REGION, 0.93, False, NEW, pool)
    assert (entry.seen, entry.wrong, entry.worst) == (1, 1, 0.93)
    assert decide(REGION, 0.93, entry, pool, 0.05) == "explore"
    assert decide(REGION, 0.85, entry, pool, 0.05) == "explore"
    assert decide(REGION, 0.95, entry, pool, 0.05) == "serve"
    assert boundary(REGION, entry, pool, 0.05) > 0.93
    # a right label later does not lower it; a wrong one higher up raises it
    assert update_entry(REGION, 0.85, True, entry, pool).worst == 0.93
    assert update_entry(REGION, 0.97, False, entry, pool).worst == 0.97
    # stored with the entry, read back; an old state without it is read as never wrong
    assert EntryState.from_json(json.loads(json.dumps(entry.to_json()))) == entry
    assert EntryState.from_json({"m": 0, "v": 1, "n": 0, "w": 0}).worst is None
    with pytest.raises(BoundError):
        EntryState.from_json({"m": 0, "v": 1, "n": 1, "w": 1, "x": "nan"})


def test_labels_are_counted_in_their_bin() -> None:
    pool = update_pool(REGION, 0.95, True, update_pool(REGION, 0.85, False, REGION.new_pool()))
    assert pool == pool_of((0, 0, 1), (0, 1, 0))


def test_the_incomplete_beta_and_clopper_pearson_match_their_closed_forms() -> None:
    # I_x(1, b) = 1 - (1 - x)^b; I_x(a, 1) = x^a
    assert regularized_beta(1.0, 7.0, 0.2) == pytest.approx(1 - 0.8**7, rel=1e-10)
    assert regularized_beta(5.0, 1.0, 0.3) == pytest.approx(0.3**5, rel=1e-10)
    # no wrong label: the one-sided upper bound is 1 - alpha^(1/n)
    for n in (10, 59, 300):
        assert clopper_pearson_upper(0, n) == pytest.approx(1 - 0.05 ** (1 / n), abs=1e-9)
    assert upper_bound_within(0, 59, 0.05) and not upper_bound_within(0, 58, 0.05)
    assert clopper_pearson_upper(2, 100) == pytest.approx(0.0616192, abs=1e-6)  # scipy's beta.ppf(0.95, 3, 98)


def _ever_certified(p_wrong: float, delta: float, labels: int, within: object, seed: int) -> bool:
    rng = random.Random(seed)
    wrong = 0
    for n in range(1, labels + 1):
        wrong += rng.random() < p_wrong
        if within(wrong, n, delta):  # type: ignore[operator]
            return True
    return False


def test_the_evidence_stays_valid_when_checked_after_every_label_and_a_one_look_bound_does_not() -> None:
    # a region whose true error is exactly delta: the bound re-checked after each of 1,000
    # labels may vouch for it in at most alpha (5 %) of runs (measured: 2.5 %); the one-look
    # Clopper-Pearson bound re-checked so does it in about a quarter of them (the flaw the
    # anytime evidence fixes)
    runs = 400
    anytime = sum(_ever_certified(0.05, 0.05, 1000, anytime_within, s) for s in range(runs)) / runs
    one_look = sum(_ever_certified(0.05, 0.05, 1000, upper_bound_within, s) for s in range(runs)) / runs
    assert anytime <= 0.05
    assert one_look > 0.15


def test_the_replayed_error_stays_under_delta_where_the_traffic_allows_it() -> None:
    # a stream whose error falls with the score: 8 % at 0.5-0.8, 3 % at 0.8-0.9, 0.5 % above
    rng = random.Random(7)
    stream = []
    for i in range(6000):
        score = rng.uniform(0.5, 1.0)
        p_wrong = 0.08 if score < 0.8 else 0.03 if score < 0.9 else 0.005
        stream.append(Lookup(f"e{i}", score, rng.random() >= p_wrong))
    for delta in (0.02, 0.05):
        result = replay(stream, REGION, delta, 0.1, len(stream), 0.0, 0, 1.0)
        assert result["served"] > 500
        assert result["error_rate"] <= delta
    # a stream wrong 20 % everywhere: nothing is served
    bad = [Lookup(f"e{i}", rng.uniform(0.5, 1.0), rng.random() >= 0.2) for i in range(3000)]
    assert replay(bad, REGION, 0.05, 0.1, len(bad), 0.0, 0, 1.0)["served"] == 0


def test_the_prior_file_keeps_its_mode_and_the_learned_verifier_gets_the_region_one(tmp_path: Path) -> None:
    path = tmp_path / "region.json"
    path.write_text(json.dumps(REGION.to_json()))
    loaded = load_prior(path)
    assert (loaded.mode, loaded.alpha, loaded.knots) == ("region", 0.05, REGION.knots)
    shipped = load_prior(DEFAULT_LEARNED_PRIOR_PATH)
    assert (shipped.kind, shipped.mode) == ("learned", "region")
    assert all(w == 0 for w in shipped.strength)  # online only: no offline label counts
    # an old file without a mode is the steps model; a bad mode or alpha is refused
    old = {k: v for k, v in REGION.to_json().items() if k not in ("mode", "alpha")}
    assert BoundPrior.from_json(old | {"probability": [0.1, 0.2, 0.3]}).mode == "steps"
    for bad in ({"mode": "bins"}, {"alpha": 0.0}, {"alpha": 0.7}):
        with pytest.raises(BoundError):
            BoundPrior.from_json(REGION.to_json() | bad)


def test_a_prior_from_labelled_pairs_starts_each_bin_with_them() -> None:
    prior = region_prior([0.55, 0.85, 0.86, 0.95], [0, 1, 0, 1], knots=(0.5, 0.8, 0.9), weight=2.0)
    assert prior.strength == (2.0, 4.0, 2.0) and prior.probability == (0.0, 0.5, 1.0)
    # 2 right pseudo-labels in the top bin, nothing else: far from vouching for 5 %
    assert region_start(prior, prior.new_pool(), 0.05) == 3


def test_fit_region_bound_writes_the_shipped_online_prior_and_needs_a_directory_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from cache.cli import app

    out = tmp_path / "region.json"
    result = CliRunner().invoke(app, ["fit-region-bound", "--online-only", "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    shipped = json.loads(DEFAULT_LEARNED_PRIOR_PATH.read_text())
    assert {k: v for k, v in written.items() if k != "fitted_on"} == {
        k: v for k, v in shipped.items() if k != "fitted_on"
    }
    monkeypatch.delenv("PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR", raising=False)
    result = CliRunner().invoke(app, ["fit-region-bound", "--out", str(out)])
    # no directory: an error either way (the shipped verifier is refused before the directory)
    assert result.exit_code == 2 and ("--public-dir" in result.output or "in-sample" in result.output)


def test_a_public_prior_is_refused_for_a_verifier_trained_on_the_public_sets(tmp_path: Path) -> None:
    # the shipped verifier is trained on STS 2012-2015 and SICK train: a prior from the same
    # pairs would be in-sample and vouch for bins far more than new text does
    from typer.testing import CliRunner

    from cache.cli import app

    out = tmp_path / "region.json"
    result = CliRunner().invoke(app, ["fit-region-bound", "--public-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2 and "in-sample" in result.output
    assert not out.exists()

"""The per-entry error bound (issue 14, item 2): state, update, decision, the offline prior and
the replay. Fast: synthetic scores, no model, no QQP run."""

from __future__ import annotations

import json
import math
import random

import pytest

from cache.errors import BoundError
from cache.training.bound_eval import Lookup, replay, sum_runs, wilson_upper
from cache.training.bound_fit import fit_prior
from cache.verify.bound.model import (
    DEFAULT_PRIOR_PATH,
    BoundPrior,
    EntryState,
    PoolState,
    boundary,
    decide,
    load_prior,
    predictive,
    sigmoid,
    update_entry,
    update_pool,
)

# a prior shaped like QQP's: P(right) grows with the cosine and levels off below 1
PRIOR = BoundPrior(
    "cosine",
    0.70,
    (0.70, 0.85, 0.90, 0.95, 0.98),
    (0.30, 0.60, 0.80, 0.93, 0.97),
    strength=(1e6,) * 5,
    offset_var=1.0,
    source="test",
)  # steps known for sure
LOOSE = BoundPrior(
    "cosine",
    0.70,
    (0.70, 0.85, 0.90, 0.95, 0.98),
    (0.30, 0.60, 0.80, 0.93, 0.97),
    strength=(20.0,) * 5,
    offset_var=1.0,
    source="loose",
)  # 20 pairs a step


def test_state_is_a_few_json_numbers_and_a_corrupt_one_is_refused() -> None:
    state = EntryState(0.4321, 0.25, seen=3, wrong=1)
    stored = json.dumps(state.to_json())
    assert json.loads(stored) == {"m": 0.4321, "v": 0.25, "n": 3, "w": 1}
    assert EntryState.from_json(json.loads(stored)) == state
    pool = update_pool(LOOSE, 0.96, False, update_pool(LOOSE, 0.99, True, LOOSE.new_pool()))
    assert json.loads(json.dumps(pool.to_json())) == {"r": [0, 0, 0, 0, 1], "w": [0, 0, 0, 1, 0]}
    assert PoolState.from_json(pool.to_json(), 5) == pool and pool.seen == 2
    for bad_pool in ({"r": [0] * 4, "w": [0] * 5}, {"r": [0, 0, 0, 0, -1], "w": [0] * 5}, {"r": "x"}, None):
        with pytest.raises(BoundError):
            PoolState.from_json(bad_pool, 5)
    for bad in (
        {"m": 0, "v": 0, "n": 0, "w": 0},
        {"m": "x", "v": 1, "n": 0, "w": 0},
        {"m": 0, "v": 1, "n": 1, "w": 2},
        {"m": float("nan"), "v": 1, "n": 0, "w": 0},
        [],
        None,
    ):
        with pytest.raises(BoundError):
            EntryState.from_json(bad)


def test_a_new_entry_of_a_new_pool_has_its_steps_probability() -> None:
    for score, expected in ((0.72, 0.30), (0.86, 0.60), (0.93, 0.80), (0.97, 0.93), (0.99, 0.97)):
        best = predictive(PRIOR, score, PRIOR.new_entry(), PRIOR.new_pool(), z=0.0)
        assert best == pytest.approx(expected, abs=1e-5)
        # decisions take the step at its 95 % lower bound: with a million pairs a step, hardly lower
        assert best - 1e-3 < predictive(PRIOR, score, PRIOR.new_entry(), PRIOR.new_pool()) < best
    # 20 pseudo-observations of 0.97 (+ 1/2 each side): the Beta mean, a little lower
    assert predictive(LOOSE, 0.99, LOOSE.new_entry(), LOOSE.new_pool(), z=0.0) == pytest.approx(19.9 / 21, abs=1e-9)
    # and its lower bound much lower: 20 pairs do not show 0.95
    assert predictive(LOOSE, 0.99, LOOSE.new_entry(), LOOSE.new_pool()) < 0.90


def test_decide_serves_only_where_the_predictive_error_is_at_most_delta() -> None:
    entry, pool = PRIOR.new_entry(), PRIOR.new_pool()
    assert decide(PRIOR, 0.99, entry, pool, 0.05) == "serve"  # 0.97 >= 0.95
    assert decide(PRIOR, 0.97, entry, pool, 0.05) == "explore"  # 0.93 < 0.95
    assert decide(PRIOR, 0.97, entry, pool, 0.0705) == "serve"
    assert decide(PRIOR, 0.99, entry, pool, 0.02) == "explore"  # the prior alone never reaches 0.98
    assert decide(PRIOR, 0.69, entry, EntryState(50.0, 0.01), 0.5) == "explore"  # below the floor: never
    assert boundary(PRIOR, entry, pool, 0.05) == 0.98
    assert boundary(PRIOR, entry, pool, 0.02) == math.inf


def test_a_wrong_answer_raises_the_entrys_boundary_and_right_ones_lower_it() -> None:
    pool = PRIOR.new_pool()
    start = PRIOR.new_entry()
    wrong = update_entry(PRIOR, 0.99, False, start, pool)
    assert wrong.mean < -0.9 and wrong.var < start.var and (wrong.seen, wrong.wrong) == (1, 1)
    assert decide(PRIOR, 0.99, wrong, pool, 0.05) == "explore"  # one wrong hit stops it serving there
    right = start
    for _ in range(30):
        right = update_entry(PRIOR, 0.93, True, right, pool)
    assert right.mean > 1.0 and right.seen == 30 and right.wrong == 0
    assert boundary(PRIOR, right, pool, 0.05) < boundary(PRIOR, start, pool, 0.05)
    # a right answer where the model was already sure teaches less than one where it doubted
    sure = update_entry(PRIOR, 0.99, True, start, pool)
    doubt = update_entry(PRIOR, 0.86, True, start, pool)
    assert 0 < sure.mean < doubt.mean


def test_the_boundary_is_the_lowest_score_decide_serves() -> None:
    rng = random.Random(3)
    for _ in range(200):
        entry = EntryState(rng.uniform(-3, 3), rng.uniform(0.01, 2))
        pool = PoolState(tuple(rng.randrange(50) for _ in range(5)), tuple(rng.randrange(5) for _ in range(5)))
        delta = rng.choice((0.01, 0.02, 0.05, 0.2))
        edge = boundary(PRIOR, entry, pool, delta)
        grid = [round(0.70 + i / 1000, 3) for i in range(301)]
        served = [s for s in grid if decide(PRIOR, s, entry, pool, delta) == "serve"]
        assert all(s in served for s in grid if s >= edge)  # everything above it serves
        below = [s for s in grid if s < edge]
        assert not below or below[-1] not in served or edge == PRIOR.knots[0]  # just below it does not


def test_a_pool_learns_step_by_step_and_a_shift_at_low_scores_stays_there() -> None:
    entry = LOOSE.new_entry()
    pool = LOOSE.new_pool()
    assert decide(LOOSE, 0.96, entry, pool, 0.05) == "explore"  # prior 0.93 with weight 20
    for _ in range(200):  # traffic far cleaner than the prior at 0.86..0.90
        pool = update_pool(LOOSE, 0.87, True, pool)
    assert predictive(LOOSE, 0.87, entry, pool, z=0.0) > 0.96  # (0.6 * 20 + 200.5) / 221
    assert predictive(LOOSE, 0.87, entry, pool) > 0.93  # its 95 % lower bound
    assert predictive(LOOSE, 0.96, entry, pool) == predictive(LOOSE, 0.96, entry, LOOSE.new_pool())
    for _ in range(200):  # and at 0.95..0.98 too: now it serves there
        pool = update_pool(LOOSE, 0.96, True, pool)
    assert decide(LOOSE, 0.96, entry, pool, 0.05) == "serve"
    for _ in range(30):  # until wrong answers come back at that step
        pool = update_pool(LOOSE, 0.96, False, pool)
    assert decide(LOOSE, 0.96, entry, pool, 0.05) == "explore"


def _world(seed: int, entries: int = 400, queries: int = 12_000) -> list[Lookup]:
    """Synthetic traffic where the model is true: entry e's answers are right with
    probability sigmoid(eta(x) + b_e), b_e ~ N(0, offset_var); popular entries are asked often."""
    rng = random.Random(seed)
    offsets = [rng.gauss(0.0, math.sqrt(PRIOR.offset_var)) for _ in range(entries)]
    stream = []
    for _ in range(queries):
        e = min(int(rng.paretovariate(1.2)) - 1, entries - 1)
        score = rng.uniform(0.70, 1.0)
        p = sigmoid(PRIOR.eta(score, PRIOR.new_pool()) + offsets[e])
        stream.append(Lookup(str(e), score, rng.random() < p))
    return stream


@pytest.mark.parametrize("delta", [0.02, 0.05])
def test_the_error_rate_among_served_hits_stays_under_delta_where_the_model_holds(delta: float) -> None:
    stream = _world(seed=11)
    result = replay(stream, PRIOR, delta, label_rate=0.1, positives=sum(s.right for s in stream), seed=1)
    assert result["served"] > 150  # it does serve: the bound is not met by refusing everything
    assert result["error_rate"] <= delta
    assert result["shadow_calls"] > 0 and result["entries_labelled_twice"] > 10
    # a static cut serving as much is not held to delta: the popular bad entries keep failing
    cut = sorted((s.score for s in stream), reverse=True)[result["served"] - 1]
    static_wrong = sum(1 for s in stream if s.score >= cut and not s.right)
    assert static_wrong / result["served"] > result["error_rate"]


def test_entry_learning_serves_where_the_prior_alone_cannot_and_catches_bad_popular_entries() -> None:
    stream = _world(seed=5)
    positives = sum(s.right for s in stream)
    frozen = replay(stream, PRIOR, 0.02, label_rate=0.0, positives=positives)
    learned = replay(stream, PRIOR, 0.02, label_rate=0.1, positives=positives, seed=2)
    assert frozen["shadow_calls"] == frozen["compared_misses"] == 0 and frozen["entries_labelled"] == 0
    assert frozen["served"] == 0  # no step reaches 0.98 by itself
    assert learned["recall"] > 0.02 and learned["error_rate"] <= 0.02  # entries earned it
    # at 0.05 the prior alone serves the popular entries whose answers are often wrong all the
    # time; with labels they are caught
    frozen = replay(stream, PRIOR, 0.05, label_rate=0.0, positives=positives)
    learned = replay(stream, PRIOR, 0.05, label_rate=0.1, positives=positives, seed=2)
    assert learned["error_rate"] < frozen["error_rate"] and learned["error_rate"] <= 0.05


def test_client_reports_teach_their_own_entry_and_never_the_pool() -> None:
    # one entry, served wrong at a score the prior trusts; reports stop it, without reports it goes on
    stream = [Lookup("e", 0.99, False)] * 20 + [Lookup("other", 0.99, True)]
    silent = replay(stream, PRIOR, 0.05, label_rate=0.0, positives=1)
    heard = replay(stream, PRIOR, 0.05, label_rate=0.0, positives=1, client_report_rate=1.0)
    assert silent["served"] == 21 and silent["client_reports"] == 0
    assert heard["served"] == 2 and heard["client_reports"] == 1  # "other" is still served
    assert heard["pool_labels"] == 0


def test_fit_prior_is_monotone_lower_bounded_and_starts_at_the_floor() -> None:
    rng = random.Random(0)
    scores = [rng.uniform(0.5, 1.0) for _ in range(4000)]
    labels = [int(rng.random() < min(0.95, max(0.0, (s - 0.6) * 2.5))) for s in scores]
    prior = fit_prior(scores, labels, floor=0.70, min_step_pairs=100)
    assert len(prior.knots) > 3
    assert prior.knots[0] == 0.70 and list(prior.knots) == sorted(prior.knots)
    assert list(prior.probability) == sorted(prior.probability)
    # a lower bound: no step above the world's precision at the step's upper end (a step is as
    # good as its lowest part, by monotony); and each step holds at least 100 training pairs
    for i, (k, p) in enumerate(zip(prior.knots, prior.probability, strict=True)):
        hi = prior.knots[i + 1] if i + 1 < len(prior.knots) else 1.0
        assert p <= min(0.95, (hi - 0.6) * 2.5)
        assert sum(1 for x in scores if k <= x < hi) >= 100
    assert prior.probability[-1] < 0.95  # the world's ceiling, never above it
    with pytest.raises(ValueError, match="floor"):
        fit_prior([0.1, 0.2], [0, 1], floor=0.70)


def test_prior_file_round_trip_and_refusals(tmp_path) -> None:
    path = tmp_path / "prior.json"
    path.write_text(json.dumps(PRIOR.to_json()))
    loaded = load_prior(path)
    assert (loaded.knots, loaded.probability, loaded.floor) == (PRIOR.knots, PRIOR.probability, PRIOR.floor)
    for content in ("{", json.dumps({"format": "other"}), json.dumps(PRIOR.to_json() | {"probability": [0.9, 0.1]})):
        path.write_text(content)
        with pytest.raises(BoundError, match="prior.json"):
            load_prior(path)
    with pytest.raises(BoundError, match="missing.json"):
        load_prior(tmp_path / "missing.json")


def test_the_shipped_prior_loads_and_was_fitted_on_train() -> None:
    prior = load_prior()
    assert prior.kind == "cosine" and prior.floor == 0.70
    assert json.loads(DEFAULT_PRIOR_PATH.read_text())["fitted_on"]["split"] == "train"


def test_wilson_upper_bounds_the_observed_rate() -> None:
    assert wilson_upper(0, 0) is None
    assert 0.0 < wilson_upper(0, 100) < 0.03
    assert wilson_upper(5, 100) > 0.05


def test_runs_sum_into_rates_of_the_sums() -> None:
    stream = [Lookup("e", 0.99, True), Lookup("f", 0.99, False)]
    runs = [replay(stream, PRIOR, 0.05, 0.5, positives=1, seed=seed) for seed in range(3)]
    total = sum_runs(runs)
    assert total["runs"] == 3 and total["served"] == sum(r["served"] for r in runs) == 6
    assert total["error_rate"] == 0.5 and total["recall"] == 1.0 and total["lookups"] == 6

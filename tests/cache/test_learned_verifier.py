"""The learned verifier (issue 14): its fixed split, its file, its calibration table, the
precision-target setting, and near-misses it must reject. Fast: a tiny fixture, no QQP run."""

from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from cache.errors import VerifierError
from cache.settings import CacheSettings
from cache.training.eval import Pairs
from cache.training.splits import SPLITS, bucket, split_of
from cache.training.verifier import split_pairs, train
from cache.verify.features import FEATURES, pair_features
from cache.verify.learned import DEFAULT_PATH, LearnedVerifier, load_verifier


def test_split_is_deterministic_disjoint_and_60_20_20() -> None:
    pairs = [(f"question number {i} about topic {i % 97}", f"another wording {i}") for i in range(6000)]
    first = [split_of(a, b) for a, b in pairs]
    assert first == [split_of(a, b) for a, b in pairs]  # same answer every time
    assert [split_of(a, b) for a, b in reversed(pairs)] == first[::-1]  # not the order of the file
    counts = {s: first.count(s) for s in SPLITS}
    assert sum(counts.values()) == len(pairs)  # every pair in exactly one split
    assert abs(counts["train"] / len(pairs) - 0.6) < 0.03
    assert abs(counts["calibration"] / len(pairs) - 0.2) < 0.03
    assert abs(counts["test"] / len(pairs) - 0.2) < 0.03
    assert all(0 <= bucket(a, b) < 100 for a, b in pairs[:100])
    assert [split_of(a, b, seed=15) for a, b in pairs] != first  # the seed re-draws it


def test_split_indices_of_a_pairs_file_are_disjoint_and_bounded() -> None:
    texts = [f"how do I do thing {i}" for i in range(900)]
    pairs = Pairs(texts, [t + "?" for t in texts], [i % 2 for i in range(900)])
    indices = split_pairs(pairs, max_per_split=None)
    seen = [i for s in SPLITS for i in indices[s]]
    assert sorted(seen) == list(range(900))  # disjoint and complete
    capped = split_pairs(pairs, max_per_split=50)
    assert all(len(capped[s]) == 50 and capped[s] == indices[s][:50] for s in SPLITS)


def test_the_shipped_file_is_plain_json_and_gives_the_training_scores() -> None:
    data = json.loads(DEFAULT_PATH.read_text())  # plain JSON: nothing to execute
    verifier = LearnedVerifier(data, "shipped")
    check = data["check"]
    rows = np.asarray(check["features"])
    assert rows.shape[1] == len(FEATURES)
    assert np.allclose(verifier.probability_of_rows(rows), check["probabilities"], atol=1e-9)
    assert data["split"]["seed"] == 14 and data["trained_on"]["pairs_per_split"]["test"] > 0


def test_a_pickle_is_refused_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Boom:
        def __reduce__(self):  # unpickling would create the marker file
            return (Path.touch, (marker,))

    path = tmp_path / "verifier.json"
    path.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(VerifierError, match="verifier.json"):
        load_verifier(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other/1"}, "format"),
        ({"features": ["cosine"]}, "features"),
        ({"model": {"kind": "forest"}}, "unknown model kind"),
        ({"thresholds": []}, "no calibrated operating points"),
        ({"platt": {}}, "malformed"),
    ],
)
def test_a_bad_file_is_a_clear_error(tmp_path: Path, change: dict, message: str) -> None:
    data = json.loads(DEFAULT_PATH.read_text()) | change
    path = tmp_path / "v.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VerifierError, match=message):
        load_verifier(path)


def test_precision_target_maps_to_the_calibrated_threshold() -> None:
    verifier = load_verifier()
    by_target = {p.target: p for p in verifier.points}
    assert verifier.threshold_for(0.90) == by_target[0.9].probability
    # between two rows: the stricter one (the next higher target)
    assert verifier.threshold_for(0.895) == by_target[0.9].probability
    assert verifier.threshold_for(0.5) == min(verifier.points, key=lambda p: p.target).probability
    probabilities = [p.probability for p in sorted(verifier.points, key=lambda p: p.target)]
    assert probabilities == sorted(probabilities)  # a higher target never loosens the threshold
    for point in verifier.points:  # the row's own calibration precision met its target
        assert point.precision_lower >= point.target
    with pytest.raises(VerifierError, match="above the highest"):
        verifier.threshold_for(0.999)


def test_settings_check_the_target_and_the_file_at_start(tmp_path: Path) -> None:
    settings = CacheSettings(verifier="learned", semantic_precision_target=0.90)
    learned = settings.learned_verifier()
    assert learned is not None and learned[1] == learned[0].threshold_for(0.90)
    assert CacheSettings(verifier="rules").learned_verifier() is None
    # issue 34: the default is the learned verifier with the rules' vetoes
    # (bench/cache_default_choice.py chose it), on candidates above the file's prefilter
    default = CacheSettings()
    assert default.verifier == "learned" and default.threshold is None
    chosen = default.learned_verifier()
    assert chosen is not None and chosen[1] == chosen[0].threshold_for(default.semantic_precision_target)
    assert default.base_threshold("m") == chosen[0].min_cosine == 0.7
    assert default.threshold_for("m", 0.9) == 0.9 and default.threshold_for("m", 0.5) == 0.7  # raise only
    # the rules keep their own 0.96 unless a threshold is set
    assert CacheSettings(verifier="rules").base_threshold("m") == 0.96
    assert CacheSettings(verifier="rules+learned").base_threshold("m") == 0.96
    assert CacheSettings(threshold=0.8).base_threshold("m") == 0.8
    rescue = CacheSettings(verifier="rules+learned").learned_verifier()
    assert rescue is not None and rescue[1] == rescue[0].threshold_for(0.93)
    with pytest.raises(ValidationError, match="above the highest"):
        CacheSettings(verifier="learned", semantic_precision_target=0.999)
    with pytest.raises(ValidationError, match="missing.json"):
        CacheSettings(verifier="learned", verifier_path=tmp_path / "missing.json")
    with pytest.raises(ValidationError, match="semantic_precision_target"):
        CacheSettings(semantic_precision_target=1.5)
    with pytest.raises(ValidationError, match="verifier"):
        CacheSettings(verifier="cosine")


@pytest.mark.parametrize(
    ("query", "cached"),
    [
        ("Who won round 1 of the debate?", "Who won round 2 of the debate?"),
        ("How do I print the list with repetitions?", "How do I print the list without repetitions?"),
        ("Why do people change?", "Why don't people change?"),
        ("Can a 19 year old date a 17 year old?", "Can a 19 year old date a 16 year old?"),
    ],
)
def test_a_near_miss_is_rejected_even_at_high_similarity(query: str, cached: str) -> None:
    verifier = load_verifier()
    threshold = verifier.threshold_for(0.90)
    assert verifier.probability(query, cached, 0.97) < threshold
    assert verifier.probability(cached, query, 0.97) < threshold
    chosen, _ = verifier.select(query, [(cached, 0.97)], threshold)
    assert chosen is None


def test_a_rewording_is_accepted() -> None:
    # short rewordings ("What is" / "What's" in an 8-word question) score below the target's
    # threshold: the QQP-trained model trusts longer questions more (cache/README.md)
    verifier = load_verifier()
    text = "How do I become a better software engineer in my current job?"
    threshold = verifier.threshold_for(0.90)
    chosen, best = verifier.select(
        text, [("How can I become a better software engineer at my current job?", 0.97)], threshold
    )
    assert chosen == 0 and best is not None and best >= threshold


def test_features_are_symmetric() -> None:
    a, b = "How do I convert PDF to HTML in 2 steps?", "How can I convert HTML files to PDF?"
    assert np.array_equal(pair_features(a, b, 0.9), pair_features(b, a, 0.9))


def _fake_encode(texts: list[str]) -> np.ndarray:
    """Unit vectors from the topic word (the last word): same topic -> near 1."""
    out = []
    for text in texts:
        rng = np.random.default_rng(zlib.crc32(text.split()[-1].encode()))
        v = rng.normal(size=8) + 0.05 * np.random.default_rng(zlib.crc32(text.encode())).normal(size=8)
        out.append(v / np.linalg.norm(v))
    return np.stack(out).astype(np.float32)


@pytest.mark.parametrize("kind", ["logistic", "trees"])
def test_training_on_a_tiny_fixture_round_trips_through_the_file(tmp_path: Path, kind: str) -> None:
    a, b, labels = [], [], []
    for i in range(600):
        topic = f"topic{i % 150}"
        a.append(f"how do I fix the {i % 7} problem {topic}")
        if i % 2:
            b.append(f"how can I repair the {i % 7} problem {topic}")  # same request
            labels.append(1)
        else:
            b.append(f"how do I fix the {i % 7 + 1} problem {topic}")  # another number
            labels.append(0)
    content = train(
        Pairs(a, b, labels),
        _fake_encode,
        max_per_split=None,
        min_cosine=0.5,
        embed_cache=tmp_path / "vectors.npz",
        embed_tag="fake",
        source="fixture",
        log=lambda _: None,
        kinds=(kind,),
    )
    path = tmp_path / "verifier.json"
    path.write_text(json.dumps(content))
    loaded = load_verifier(path)
    assert loaded.kind == kind
    check = content["check"]
    assert np.allclose(loaded.probability_of_rows(np.asarray(check["features"])), check["probabilities"], atol=1e-9)
    assert (tmp_path / "vectors.npz").exists()  # a second run reuses the vectors
    again = train(
        Pairs(a, b, labels),
        _fake_encode,
        max_per_split=None,
        min_cosine=0.5,
        embed_cache=tmp_path / "vectors.npz",
        embed_tag="fake",
        source="fixture",
        log=lambda _: None,
        kinds=(kind,),
    )
    assert again["thresholds"] == content["thresholds"]


def test_word_order_is_a_feature_so_a_swapped_role_is_not_a_paraphrase() -> None:
    # issue 34: held-out near-misses reuse every word in another role ("a dog is licking a
    # baby"); bag-of-words features and the cosine cannot see it, word order can
    from cache.verify.features import FEATURES, pair_features

    order = FEATURES.index("order_discordance")
    swapped = pair_features("A baby is licking a dog", "A dog is licking a baby", 0.97)
    same = pair_features("A man is slicing potatoes", "The man is slicing a potato", 0.97)
    assert swapped[order] == 1.0 and same[order] == 0.0
    assert pair_features("A dog is licking a baby", "A baby is licking a dog", 0.97)[order] == 1.0  # symmetric


def test_the_learned_stage_serves_only_confident_candidates_that_no_rule_vetoes() -> None:
    # issue 34's default ("learned"): a candidate is served only when the learned verifier is
    # sure enough and no rule vetoes it; "rules+learned" uses the same choice below its rules
    settings = CacheSettings()
    assert settings.verifier == "learned"
    learned = settings.learned_verifier()
    assert learned is not None
    verifier, default_threshold = learned
    assert default_threshold == verifier.threshold_for(settings.semantic_precision_target)
    threshold = 0.7  # the logic at a threshold these short texts reach at cosine 0.95
    query = "What is the best way to learn Python quickly?"
    same = ("What's the best way to learn Python quickly?", 0.95)
    negated = ("What is the best way not to learn Python quickly?", 0.95)
    other = ("What is the best way to learn Java quickly?", 0.95)

    def chosen(cands: list[tuple[str, float]]) -> int | None:
        return verifier.select(query, cands, threshold, 0.02, vetoes=True)[0]

    assert verifier.probability(query, *same) >= threshold
    assert chosen([same]) == 0
    assert chosen([negated, same]) == 1  # the veto skips it
    assert chosen([negated]) is None
    assert verifier.select(query, [negated], 0.0, 0.02)[0] == 0  # without vetoes it would be served
    assert chosen([other]) is None
    assert chosen([(same[0], 0.65)]) is None  # below the prefilter
    assert chosen([]) is None

"""The held-out public sets of issue 34 (cache/training/public_sets.py): labels as documented,
bad files named with their line, and the bench says a set it cannot read was skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache.errors import PairsFormatError
from cache.training.public_sets import STS2016_FILES, layout, load_sick, load_sts2016


def _sts(tmp_path: Path, lines: dict[str, str]) -> Path:
    (tmp_path / "sts2016").mkdir()
    for name in STS2016_FILES:
        (tmp_path / "sts2016" / f"{name}.test.tsv").write_text(lines.get(name, ""))
    return tmp_path


def test_sts_labels_same_meaning_from_score_4_and_skips_unscored_lines(tmp_path: Path) -> None:
    directory = _sts(
        tmp_path,
        {
            "headlines": "4.2\tA dog runs.\tThe dog is running.\n\tnot scored\tskipped\n3\tNo hot water.\tNo water.\n",
            "question-question": "5\tHow do I boil an egg?\tHow to boil an egg?\n0.4\tX?\tY?\n",
        },
    )
    pairs = load_sts2016(directory)
    assert pairs.labels == [1, 0, 1, 0]
    assert pairs.text_a[1] == "No hot water." and pairs.text_b[0] == "The dog is running."


def test_sts_bad_score_names_file_and_line(tmp_path: Path) -> None:
    directory = _sts(tmp_path, {"plagiarism": "4\ta\tb\nhigh\ta\tb\n"})
    with pytest.raises(PairsFormatError, match=r"plagiarism.test.tsv: line 2: score 'high'"):
        load_sts2016(directory)


def test_sick_is_same_meaning_only_for_strong_entailment(tmp_path: Path) -> None:
    (tmp_path / "sick2014").mkdir()
    (tmp_path / "sick2014" / "SICK_test_annotated.txt").write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        "1\tA man is slicing potatoes\tA man is cutting potatoes\t4.8\tENTAILMENT\n"
        "2\tA baby is licking a dog\tA dog is licking a baby\t4.6\tCONTRADICTION\n"
        "3\tA man is playing a guitar\tA person is playing an instrument\t4.1\tENTAILMENT\n"
    )
    assert load_sick(tmp_path).labels == [1, 0, 0]


def test_a_missing_set_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(PairsFormatError, match=r"not found in PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR .*--fetch"):
        load_sick(tmp_path)


def test_downloads_are_pinned_to_one_commit() -> None:
    urls = [url for _, url in layout().values()]
    assert len(urls) == 6 and all("/brmson/dataset-sts/e1d3375f5b3bc24f21aa4e46f96eb379e9fc1081/" in u for u in urls)


def test_the_choice_bench_says_which_sets_it_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.bench_script import load_bench

    bench = load_bench("cache_default_choice")
    monkeypatch.setattr(bench, "QQP", tmp_path / "no-qqp.tar.gz")
    monkeypatch.setattr(bench, "GPTCACHE", tmp_path / "no-gptcache.json")
    sets, skipped = bench.load_sets(tmp_path)
    assert sets == {}
    assert "no-qqp.tar.gz" in skipped["qqp_test"] and skipped["multi_turn"] == "needs QQP's test split"
    assert "not found" in skipped["sts2016"] and "not found" in skipped["sick2014"]
    _, skipped = bench.load_sets(None)
    assert "PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR" in skipped["sts2016"]


def test_the_choice_rule_keeps_precision_on_every_set_then_takes_recall() -> None:
    from tests.bench_script import load_bench

    bench = load_bench("cache_default_choice")

    def row(precision: float, recall: float, wrong_across: int = 0) -> dict[str, object]:
        return {"precision": precision, "recall": recall, "wrong_across_contexts": wrong_across}

    today = bench.TODAY
    table = {
        "qqp_test": {today: row(0.90, 0.16), "more": row(0.895, 0.30), "loose": row(0.85, 0.50)},
        "gptcache_999": {today: row(0.97, 0.28), "more": row(0.96, 0.40), "loose": row(0.97, 0.70)},
        "multi_turn": {today: row(0.89, 0.05), "more": row(0.90, 0.08), "loose": row(0.90, 0.10, 1)},
    }
    winner, failed = bench.choose(table)
    assert winner == "more" and not failed[today]
    assert any("qqp_test precision" in r for r in failed["loose"])
    assert any("wrong across contexts" in r for r in failed["loose"])


def test_gptcaches_floor_is_the_issues_target_not_todays_precision() -> None:
    # issue 34 asks for GPTCache's hit rate at precision >= 0.95, below today's 0.969: a stage
    # at 0.954 qualifies there; one below 0.95 does not, whatever its recall
    from tests.bench_script import load_bench

    bench = load_bench("cache_default_choice")

    def row(precision: float, recall: float) -> dict[str, object]:
        return {"precision": precision, "recall": recall, "wrong_across_contexts": 0}

    today = bench.TODAY
    table = {
        "qqp_test": {today: row(0.904, 0.17), "more": row(0.904, 0.21), "loose": row(0.904, 0.30)},
        "gptcache_999": {today: row(0.969, 0.28), "more": row(0.954, 0.54), "loose": row(0.949, 0.70)},
    }
    winner, failed = bench.choose(table)
    assert winner == "more" and not failed["more"]
    assert failed["loose"] == ["gptcache_999 precision 0.949 < 0.95"]


def test_the_bounds_prior_sets_are_labelled_alike_and_never_an_evaluation_set(tmp_path: Path) -> None:
    from cache.training.public_sets import PRIOR_STS_FILES, SICK_PRIOR_FILE, load_prior_sets, prior_layout

    upstream = [path for path, _ in prior_layout().values()]
    evaluation = {path for path, _ in layout().values()}
    # MSRpar is MRPC's (kept apart by issue 34); 2016 and SICK's test split are evaluation sets
    assert not any("MSRpar" in p or "/2016/" in p or p in evaluation for p in upstream)
    assert f"data/sts/sick2014/{SICK_PRIOR_FILE}" in upstream
    sts = tmp_path / "prior" / "sts"
    for name in PRIOR_STS_FILES:
        (sts / name).parent.mkdir(parents=True, exist_ok=True)
        (sts / f"{name}.tsv").write_text("")
    (sts / "2014/images.test.tsv").write_text("4.6\tA cat.\tA cat sits.\n\tunscored\tx\n2\tA dog.\tA car.\n")
    (tmp_path / "prior" / "sick2014").mkdir(parents=True)
    (tmp_path / "prior" / "sick2014" / SICK_PRIOR_FILE).write_text(
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
        "1\tA man sings.\tA man is singing.\t4.9\tENTAILMENT\n2\tA man sings.\tA man is not singing.\t4.1\tCONTRADICTION\n"
    )
    pairs = load_prior_sets(tmp_path)
    assert pairs.labels == [1, 0, 1, 0]
    assert pairs.text_b == ["A cat sits.", "A car.", "A man is singing.", "A man is not singing."]


def test_extra_training_pairs_do_not_eat_the_main_sets_cap() -> None:
    from cache.training.eval import Pairs
    from cache.training.splits import split_of
    from cache.training.verifier import with_extra

    qqp = Pairs([f"q{i}" for i in range(400)], [f"r{i}" for i in range(400)], [i % 2 for i in range(400)])
    extra = Pairs([f"s{i}" for i in range(300)], [f"t{i}" for i in range(300)], [1] * 300)
    mixed = with_extra(qqp, 50, extra)
    assert mixed.text_a[:300] == extra.text_a  # every extra pair
    main = [(a, b) for a, b in zip(mixed.text_a, mixed.text_b, strict=True) if a.startswith("q")]
    per_split = {s: sum(split_of(a, b) == s for a, b in main) for s in ("train", "calibration", "test")}
    assert per_split == {"train": 50, "calibration": 50, "test": 50}

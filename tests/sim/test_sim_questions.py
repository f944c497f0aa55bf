"""The question mix: real QQP pairs, repeats and paraphrases in the documented proportions."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sim.client.questions import MixConfig, QuestionMix, QuestionsFormatError, load_pairs
from sim.client.sample import QUESTIONS_FILE


@pytest.fixture(scope="module")
def qqp(data_dir: Path):
    return load_pairs(data_dir / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz")


def test_qqp_archive_loads_with_labels(qqp) -> None:
    assert len(qqp) > 80_000  # 80,854 pairs, minus the few with identical or empty texts
    duplicates = sum(p.duplicate for p in qqp)
    assert 29_000 < duplicates < 30_142


def test_mix_repeats_and_paraphrases_earlier_questions(qqp) -> None:
    sources: dict[str, list] = {}
    for pair in qqp:
        sources.setdefault(pair.text_b, []).append(pair)
    prompts = QuestionMix(qqp, MixConfig(seed=3)).take(5000)
    kinds = Counter(p.kind for p in prompts)
    assert kinds["repeat"] == pytest.approx(1500, rel=0.1)
    assert kinds["paraphrase"] == pytest.approx(750, rel=0.15)
    assert kinds["near_miss"] == pytest.approx(250, rel=0.25)
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.kind == "repeat":
            assert prompt.text in seen
        elif prompt.kind == "new":
            assert prompt.text not in seen
        else:
            assert any(
                pair.text_a in seen and pair.duplicate == (prompt.kind == "paraphrase") for pair in sources[prompt.text]
            )
        seen.add(prompt.text)


def test_mix_is_deterministic_per_seed(qqp) -> None:
    first = QuestionMix(qqp, MixConfig(seed=5)).take(300)
    assert first == QuestionMix(qqp, MixConfig(seed=5)).take(300)
    assert first != QuestionMix(qqp, MixConfig(seed=6)).take(300)


def test_shipped_sample_questions_load() -> None:
    pairs = load_pairs(QUESTIONS_FILE)
    assert len(pairs) == 1920 and any(p.duplicate for p in pairs) and not all(p.duplicate for p in pairs)


def test_bad_question_file_names_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps([{"text_a": "a?", "text_b": "b?", "label": 1}, {"text_a": "a?", "label": 1}]))
    with pytest.raises(QuestionsFormatError, match=r"q.json: entry 1"):
        load_pairs(path)


def test_mix_fractions_are_checked() -> None:
    with pytest.raises(ValueError):
        MixConfig(repeat=0.8, paraphrase=0.3)

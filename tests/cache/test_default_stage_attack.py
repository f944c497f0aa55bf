"""Attack round on the default verification stage ("learned" with the rules' vetoes, issue 34),
on a real Redis and the real all-MiniLM-L6-v2: wrong answers the default serves, and the
rejection counters it writes (branch attack2; these tests fail on the tree they were written on).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cache.embed.encoder import Encoder
from cache.verify.learned import DEFAULT_PATH
from tests.cache.helpers import Factory, answer, ask, started_caches

pytestmark = pytest.mark.slow


@pytest.fixture()
async def make_cache(redis_url: str, encoder: Encoder) -> AsyncIterator[Factory]:
    """Started caches with the shipped defaults (no threshold or verifier pinned)."""
    async with started_caches(redis_url, encoder) as factory:
        yield factory


# Same words but for a negation the rules do not read, a unit, a period or a verb: another
# request, another answer. No rule vetoes them (no number differs, no listed opposite) and the
# learned verifier's probability is above its 0.90-target threshold (0.872): the default serves
# the cached answer (cosines 0.976-0.993; the rules at 0.96 served them too).
WRONG_NO_RULE_CATCHES = [
    # a negation the rules do not read: "w/o" (cosine 0.988, p 0.963), "-free" (0.976, p 0.880)
    (
        "Give me a recipe for chocolate chip cookies with eggs.",
        "Give me a recipe for chocolate chip cookies w/o eggs.",
    ),
    (
        "Give me a recipe for chocolate chip cookies with gluten.",
        "Give me a recipe for gluten-free chocolate chip cookies.",
    ),
    (
        "Set the timeout to 30 seconds for every outgoing request in the http client configuration.",
        "Set the timeout to 30 minutes for every outgoing request in the http client configuration.",
    ),
    (
        "Schedule the backup job to run daily and keep the last week of archives on the server.",
        "Schedule the backup job to run weekly and keep the last week of archives on the server.",
    ),
    (
        "Schedule the backup job to run every day at midnight and keep the last week of archives.",
        "Schedule the backup job to run every hour at midnight and keep the last week of archives.",
    ),
    (
        "Write a python function that reads a csv file and returns the sum of the values in the second column.",
        "Write a python function that writes a csv file and returns the sum of the values in the second column.",
    ),
]


@pytest.mark.parametrize(("stored", "asked"), WRONG_NO_RULE_CATCHES)
async def test_the_default_does_not_serve_a_change_no_rule_catches(
    make_cache: Factory, stored: str, asked: str
) -> None:
    cache = await make_cache()
    assert cache.settings.verifier == "learned"
    await cache.store(ask(stored), answer("cached answer"))
    hit = await cache.lookup(ask(asked))
    assert hit is None, f"served {stored!r} for {asked!r} (similarity {hit.similarity if hit else None})"


ROUND_2 = "Who won round 2 of the debate?"
ROUND_1 = "Who won round 1 of the debate?"  # cosine 0.976 to ROUND_2, the numbers rule vetoes it
ROUND_2_REWORDED = "Who was the winner in round 2 of the debate?"  # cosine 0.970, served


async def test_a_vetoed_candidate_skipped_before_a_hit_is_counted_as_the_rules_count_it(make_cache: Factory) -> None:
    # the rules count the vetoed nearer candidate under "number" and then serve the rewording;
    # the default stage serves the same rewording, and its docstring says vetoes are "counted
    # under the rule's reason", but it counts nothing when a later candidate is served
    rules = await make_cache(verifier="rules", key_prefix="promptedge:rules")
    await rules.store(ask(ROUND_1), answer("A."))
    await rules.store(ask(ROUND_2_REWORDED), answer("B."))
    hit = await rules.lookup(ask(ROUND_2))
    assert hit is not None and hit.response["choices"][0]["message"]["content"] == "B."
    assert (await rules.stats())["rejected"] == {"number": 1}

    learned = await make_cache()
    await learned.store(ask(ROUND_1), answer("A."))
    await learned.store(ask(ROUND_2_REWORDED), answer("B."))
    hit = await learned.lookup(ask(ROUND_2))
    assert hit is not None and hit.response["choices"][0]["message"]["content"] == "B."
    assert (await learned.stats())["rejected"] == {"number": 1}


async def test_a_candidate_the_verifier_never_judged_is_not_counted_as_rejected(make_cache: Factory) -> None:
    # the nearest candidate (cosine 0.928) is refused by the verifier's probability: one
    # "learned" rejection. The other (cosine 0.752) is more than candidate_margin (0.02) below
    # it, so select() never judges it, as the rules' select() stops there; the default stage
    # still counts it as a second "learned" rejection.
    cache = await make_cache()
    await cache.store(ask("How do I switch on the lights in the kitchen?"), answer("Flip the switch."))
    await cache.store(ask("How do I turn on the lights in the bathroom?"), answer("Pull the cord."))
    assert await cache.lookup(ask("How do I turn on the lights in the kitchen?")) is None
    assert (await cache.stats())["rejected"] == {"learned": 1}


async def test_unrelated_entries_below_the_verifier_prefilter_are_not_rejections(make_cache: Factory) -> None:
    # a request that may loosen the cosine to 0 (min_request_threshold 0): the learned stage still
    # judges nothing below its 0.70 prefilter, so an unrelated question is a plain miss, not
    # one rejection per stored entry
    cache = await make_cache(min_request_threshold=0.0)
    for text in ("What is the capital of France?", "How do I bake sourdough bread?", "Explain TCP handshakes."):
        await cache.store(ask(text), answer("x"))
    assert await cache.lookup(ask("Which running shoes are best for flat feet?", threshold=0.0)) is None
    assert (await cache.stats())["rejected"] == {}


ROLE_SWAPS = [  # (cached, asked, its cached answer): cosines 0.947, 0.957, 0.954, all below 0.96
    ("Who directed the movie Inception?", "Who starred in the movie Inception?", "Christopher Nolan."),
    ("who wrote the song bohemian rhapsody", "who produced the song bohemian rhapsody", "Freddie Mercury."),
    # "while" / "after" is no contrast pair of the rules (before/after/during are); p 0.875
    ("Is it safe to take aspirin while pregnant?", "Is it safe to take aspirin after pregnancy?", "Avoid it."),
]


@pytest.mark.parametrize(("stored", "asked", "said"), ROLE_SWAPS)
async def test_the_default_does_not_serve_another_question_below_the_rules_threshold(
    make_cache: Factory, stored: str, asked: str, said: str
) -> None:
    # a wrong answer the default change introduced: below the rules' 0.96 (the old default
    # refuses it), no rule vetoes it, and the learned verifier gives 0.880 / 0.876 >= 0.872 (its
    # threshold for the 0.90 target): who did one thing is served as who did another
    rules = await make_cache(verifier="rules", key_prefix="promptedge:rules")
    await rules.store(ask(stored), answer(said))
    assert await rules.lookup(ask(asked)) is None
    cache = await make_cache()
    await cache.store(ask(stored), answer(said))
    hit = await cache.lookup(ask(asked))
    assert hit is None, f"served {stored!r} for {asked!r} (similarity {hit.similarity if hit else None})"


async def test_a_lookup_does_not_fail_when_the_verifier_file_goes_away_after_start(
    make_cache: Factory, tmp_path: Path
) -> None:
    # The stage loaded its verifier at start (SemanticCache._learned), yet with THRESHOLD unset
    # every lookup re-reads the file's prefilter (settings.base_threshold -> cached_verifier: a
    # stat per request). A file being replaced (a config volume updated, a package upgraded in
    # place) or removed makes every lookup raise VerifierError out of ResponseCache.lookup
    # instead of serving from the loaded verifier (or missing): the router answers 500.
    path = tmp_path / "verifier.json"
    shutil.copyfile(DEFAULT_PATH, path)
    cache = await make_cache(verifier_path=path)
    await cache.store(ask("Why is the sky blue?"), answer("Rayleigh scattering."))
    assert await cache.lookup(ask("Why does the sky look blue?")) is not None
    path.unlink()
    hit = await cache.lookup(ask("Why does the sky look blue?"))  # raises VerifierError
    assert hit is None or hit.kind == "semantic"


@pytest.mark.parametrize("verifier", ["rules", "learned"])
async def test_with_the_bound_the_similarity_threshold_settings_are_not_used(
    make_cache: Factory, verifier: str
) -> None:
    # CacheSettings' docstring, error_bound: "The similarity threshold settings are not used
    # then; X-Cache-Threshold can only raise the floor." With the rules the lookup searches from
    # the prior's floor whatever MODEL_THRESHOLDS says; with the default "learned" the service
    # now passes threshold_for(model) (0.99 here), so a per-model threshold left from the rules
    # silently narrows what the bound explores and learns from.
    cache = await make_cache(verifier=verifier, error_bound=0.05, model_thresholds={"m": 0.99})
    assert cache.semantic is not None
    seen: list[float] = []
    lookup = cache.semantic.lookup

    async def spy(query: Any, threshold: float, *args: Any, **kwargs: Any) -> Any:
        seen.append(threshold)
        return await lookup(query, threshold, *args, **kwargs)

    cache.semantic.lookup = spy  # type: ignore[method-assign]
    await cache.lookup(ask("Why does the sky look blue?"))
    assert seen and seen[0] < 0.99

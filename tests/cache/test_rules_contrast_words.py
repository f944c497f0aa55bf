"""Contrast words (issue 34, attack round): near-miss questions that the default semantic stage
(``VERIFIER=rules+learned``, rules at cosine 0.96, learned rescue at precision 0.93) served with
another question's answer, all through the rules (cosine >= 0.96): the texts differ only by a
contrast word (to/from, after/during, last/this year, safe/dangerous, healthier/less healthy),
by two operands trading places, or by an offset's sign. On a real Redis and the real
all-MiniLM-L6-v2, plus the rules alone (cache/verify/rules.py) on the same pairs and on
paraphrases they must keep serving.

Each pair: (the cached question, a different question whose right answer differs). The tests
assert the documented behaviour (a near-duplicate that asks for something else is not served).
``test_scope_*`` check the scope on a pair the default stage does serve.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from cache import CacheControl, CacheRequest, CacheSettings, ResponseCache
from cache.embed.encoder import Encoder
from cache.verify.rules import RULES, Verdict, rule_flags, verify
from tests.cache.helpers import answer

# (stored question, asked question): each was served by the default stage, a wrong answer
WRONG = [
    # direction: one preposition changed (the rules' "direction" rule needs a swapped order)
    ("cheap flights to london", "cheap flights from london"),
    ("how do i transfer files to my iphone?", "how do i transfer files from my iphone?"),
    ("how do i move money to my savings account?", "how do i move money from my savings account?"),
    ("how do i upload files to google drive?", "how do i upload files from google drive?"),
    ("how do i download videos from youtube?", "how do i download videos to youtube?"),
    ("best way to get to the airport", "best way to get from the airport"),
    ("how long is the train ride to rome?", "how long is the train ride from rome?"),
    # opposite polarity without an antonym from the rules' list
    ("is it safe to eat raw eggs?", "is it dangerous to eat raw eggs?"),
    ("which is healthier, tea or coffee?", "which is less healthy, tea or coffee?"),
    # time: another phase
    ("what to eat after a workout", "what to eat during a workout"),
    ("what can i do when my phone is stolen?", "what can i do before my phone is stolen?"),
    ("who won the super bowl last year?", "who won the super bowl this year?"),
    # code: operands swapped, an offset's sign (the number rule drops the sign)
    ("what does this code do: x = a if b else c", "what does this code do: x = b if a else c"),
    ("fix the bug: for i in range(len(a)): print(a[i+1])", "fix the bug: for i in range(len(a)): print(a[i-1])"),
]

# (stored, asked): the same question, which the contrast words must not veto. "I" / "you" is
# the generic "you" in a question to an assistant ("how much tax do you pay" asks what anyone
# pays), so a pronoun swap is a paraphrase (the attack round listed two as wrong answers).
SAME = [
    ("how much tax do i pay on a salary of 50000?", "how much tax do you pay on a salary of 50000?"),
    ("should i invest in bitcoin now?", "should you invest in bitcoin now?"),
    ("which is healthier, tea or coffee?", "which is more healthy, tea or coffee?"),
    ("which is better, tea or coffee?", "which is better, coffee or tea?"),
    ("why chemistry is so boring?", "why is chemistry so boring?"),
    ("how long does covid-19 last?", "how long does covid 19 last?"),
    ("how do i convert pdf to word?", "how do i convert pdf into word?"),
    ("what is the last step of the install?", "what is the final step of the install?"),
    ("what does this code do: x = a + 1", "what does this code do: x = a+1"),
]


@pytest.mark.parametrize(("stored", "asked"), WRONG)
def test_rules_veto_a_contrast_word(stored: str, asked: str) -> None:
    assert not verify(asked, stored).ok
    assert not verify(stored, asked).ok
    # the learned verifier sees the same veto among its features (no new rule name: the
    # shipped verifier file names its features)
    assert any(rule_flags(asked, stored)[name] for name in RULES)


@pytest.mark.parametrize(("stored", "asked"), SAME)
def test_rules_keep_a_paraphrase(stored: str, asked: str) -> None:
    assert verify(asked, stored).ok
    assert verify(stored, asked).ok


@pytest.mark.parametrize(
    ("stored", "asked", "reason"),
    [
        ("cheap flights to london", "cheap flights from london", "direction"),
        ("how do i log in to gmail?", "how do i log out of gmail?", "direction"),
        ("what to eat after a workout", "what to eat during a workout", "direction"),
        ("what does this code do: x = a if b else c", "what does this code do: x = b if a else c", "direction"),
        ("who won the super bowl last year?", "who won the super bowl this year?", "number"),
        ("is it going to rain today?", "is it going to rain tomorrow?", "number"),
        ("fix the bug: print(a[i+1])", "fix the bug: print(a[i-1])", "number"),
        ("is it safe to eat raw eggs?", "is it dangerous to eat raw eggs?", "opposite"),
        ("which is healthier, tea or coffee?", "which is less healthy, tea or coffee?", "opposite"),
        ("which is the safest car?", "which is the least safe car?", "opposite"),
    ],
)
def test_contrast_counts_for_an_existing_rule(stored: str, asked: str, reason: str) -> None:
    assert verify(asked, stored).reason == reason
    assert rule_flags(asked, stored)[reason]


def ask(text: str, tenant: str = "t1", model: str = "m", system: str | None = None, **params: Any) -> CacheRequest:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return CacheRequest("chat.completions", {"model": model, "messages": messages, **params}, tenant, CacheControl())


@pytest.fixture()
async def cache(redis_url: str, encoder: Encoder) -> AsyncIterator[ResponseCache]:
    client = aioredis.Redis.from_url(redis_url)
    # the shipped defaults (rules+learned, 0.96, rescue 0.93); only generous timeouts
    made = ResponseCache(client, CacheSettings(redis_timeout_s=1.0, embed_timeout_s=10.0), encoder=encoder)
    await made.start()
    yield made
    await made.aclose()
    await client.aclose()


@pytest.mark.slow
@pytest.mark.parametrize(("stored", "asked"), WRONG)
async def test_near_miss_not_served_by_default_stage(cache: ResponseCache, stored: str, asked: str) -> None:
    assert await cache.store(ask(stored), answer(f"the answer to: {stored}"))
    hit = await cache.lookup(ask(asked))
    served = None if hit is None else hit.response["choices"][0]["message"]["content"]
    assert served is None, f"{asked!r} was answered with {served!r}"


@pytest.mark.slow
@pytest.mark.parametrize(("stored", "asked"), SAME[:2])
async def test_pronoun_swap_still_served(cache: ResponseCache, stored: str, asked: str) -> None:
    assert await cache.store(ask(stored), answer(f"the answer to: {stored}"))
    hit = await cache.lookup(ask(asked))
    assert hit is not None and hit.kind == "semantic"


# served by the learned rescue (cosine 0.952 < 0.96): a paraphrase, so the scope tests can use it
RESCUED = ("What should you do if you're feeling angry?", "What do you do when you feel angry?")


@pytest.mark.slow
async def test_rescue_serves_paraphrase(cache: ResponseCache) -> None:
    assert await cache.store(ask(RESCUED[0]), answer("breathe"))
    hit = await cache.lookup(ask(RESCUED[1]))
    assert hit is not None and hit.kind == "semantic"


@pytest.mark.slow
@pytest.mark.parametrize(
    "other",
    [
        {"tenant": "t2"},
        {"model": "m2"},
        {"system": "You answer in French."},
        {"temperature": 0.0},
        {"max_tokens": 5},
        {"n": 2},
        {"response_format": {"type": "json_object"}},
        {"seed": 7},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    ],
)
async def test_scope_rescue_never_crosses(cache: ResponseCache, other: dict[str, Any]) -> None:
    assert await cache.store(ask(RESCUED[0]), answer("breathe"))
    assert await cache.lookup(ask(RESCUED[1], **other)) is None


@pytest.mark.parametrize(
    ("query", "candidate", "reason"),
    [
        # second attack round (issue 34): what the learned default served with another answer
        ("Cookies with eggs, please.", "Cookies w/o eggs, please.", "negation"),
        ("A recipe for cookies with gluten.", "A recipe for gluten-free cookies.", "negation"),
        ("Set the timeout to 30 seconds.", "Set the timeout to 30 minutes.", "opposite"),
        ("Run the backup job daily.", "Run the backup job weekly.", "opposite"),
        ("Run the backup every day at noon.", "Run the backup every hour at noon.", "opposite"),
        ("A function that reads a csv file.", "A function that writes a csv file.", "opposite"),
        ("Who directed the movie Inception?", "Who starred in the movie Inception?", "opposite"),
        ("Is aspirin safe while pregnant?", "Is aspirin safe after pregnancy?", "opposite"),
    ],
)
def test_periods_roles_and_written_negations_are_contrasts(query: str, candidate: str, reason: str) -> None:
    assert verify(query, candidate) == Verdict(False, reason)


@pytest.mark.parametrize(
    ("query", "candidate"),
    [
        ("Run the backup every day.", "Run the backup daily."),  # one period, two words
        ("How many hours are in a day?", "How many hours does a day have?"),
        ("Is the cake free of gluten?", "Is the cake free of gluten at all?"),
    ],
)
def test_the_same_period_or_a_plain_free_is_no_contrast(query: str, candidate: str) -> None:
    assert verify(query, candidate).ok

"""Verification stage: near-duplicates that ask for something else are rejected, paraphrases
pass. Cases from the issue and from reading QQP false positives."""

from __future__ import annotations

import pytest

from cache.verify.rules import Verdict, verify


@pytest.mark.parametrize(
    ("a", "b", "reason"),
    [
        ("Turn on the lights in the kitchen", "Turn off the lights in the kitchen", "opposite"),
        ("Allow access to the admin panel for guests", "Deny access to the admin panel for guests", "opposite"),
        ("Enable two-factor authentication", "Disable two-factor authentication", "opposite"),
        ("How do I print the list with repetitions?", "How do I print the list without repetitions?", "negation"),
        ("Why do people change?", "Why don't people change?", "negation"),
        ("Why can’t I sleep?", "Why can I sleep?", "negation"),
        ("How do I convert PDF to HTML?", "How do I convert HTML to PDF?", "direction"),
        (
            "What do Indians find most annoying about Americans?",
            "What do Americans find most annoying about Indians?",
            "direction",
        ),
        ("Are cats afraid of tigers?", "Are tigers afraid of cats?", "direction"),
        ("Who won round 1 of the debate?", "Who won round 2 of the debate?", "number"),
        ("Can a 19 year old date a 17 year old?", "Can a 19 year old date a 16 year old?", "number"),
        ("What are the three laws of motion?", "What are the 2 laws of motion?", "number"),
        ("Which rehab center is near Early County GA?", "Which rehab center is near Cobb County GA?", "entity"),
    ],
)
def test_rejects_a_different_request(a: str, b: str, reason: str) -> None:
    assert verify(a, b).reason == reason
    assert verify(b, a).reason == reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How can I turn on the kitchen lights?", "How do I turn on the lights in the kitchen?"),
        (
            "What is the difference between militants and terrorists?",
            "What is the difference between terrorists and militants?",
        ),
        ("Would you rather be rich or happy?", "Would you rather be happy or rich?"),
        ("Should cow slaughter be banned in India?", "Should cow slaughter be banned in India or not?"),
        ("How can I lose 5 kg in one month?", "How can I lose 5 kg in 1 month?"),
        ("How will Trump's victory affect India?", "How will Trump's victory affect INDIA?"),
        (
            "What's the difference between IITs and other colleges?",
            "What is the difference between IIT and other colleges?",
        ),
        ("How do I learn Python fast?", "What is the quickest way to learn Python?"),
    ],
)
def test_accepts_a_paraphrase(a: str, b: str) -> None:
    assert verify(a, b).ok, verify(a, b)
    assert verify(b, a).ok


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # reworded statements (GPTCache's paraphrase set): reordering there is style
        (
            "Serialized datasets can be saved to cloud storage using `Dataset.save_to_disk()`.",
            "`Dataset.save_to_disk()` can be used to store serialized datasets in cloud storage.",
        ),
        (
            "One can check the hash of any Python object using the fingerprint.Hasher.",
            "The fingerprint.Hasher can be used to generate the hash of any Python object.",
        ),
    ],
)
def test_accepts_a_reworded_statement(a: str, b: str) -> None:
    assert verify(a, b).ok, verify(a, b)


def test_a_detached_negation_is_a_negation_not_an_error() -> None:
    # attack round (Dec 4): "do n't" (a tokenised contraction) parsed into an empty word, and
    # every rule that reads a word's first letter raised IndexError (a 500 on the lookup)
    from cache.verify.features import FEATURES, pair_features
    from cache.verify.rules import rule_flags

    assert verify("Why do cats like water?", "Why do n't cats like water?") == Verdict(False, "negation")
    assert verify("Why do n't cats like water?", "Why don't cats like water?").ok
    assert rule_flags("n't", "Why do n't cats like water?")["negation"] is False
    assert pair_features("Why do n't cats like 2 baths?", "Why do cats like two baths?", 0.9).shape == (len(FEATURES),)

"""A multi-turn context set built from labelled question pairs, and how each way of keying a
conversation scores on it (issue 14, item 5).

No public multi-turn set with labels ships in ``../shared/data``, so the set is built from QQP's
labelled pairs (its test split for evaluation: ``cache/training/splits.py``). Each case is a stored
conversation and a query conversation; label 1 when the stored answer is right for the query:

- ``other_context``: the earlier user turns are a QQP pair labelled *different* (often near
  duplicates: "learn Python" / "learn Java"), the last turn is the same context-dependent
  follow-up ("How long does it take?"). Label 0: the follow-up's answer depends on the turn
  before. A cache keyed by the last message alone serves it.
- ``other_question_same_answer``: as ``other_context``, but the assistant turn is the same, as
  when the first question was answered from an entry of the other (a wrong hit, or a generic
  answer). Label 0. Only a cache that compares earlier user turns by meaning can err here.
- ``paraphrased_context``: the earlier user turns are a QQP pair labelled *the same*, the
  assistant turn is the same (the first turn was itself answered from the cache), the follow-up
  is the same. Label 1: the recall a cache gives up when it requires the context verbatim.
- ``same_context``: the same earlier turns (a question and its answer); the last turns are a QQP
  pair, labelled as QQP labels it: the single-turn decision after a shared context.

The follow-ups are written here (``FOLLOW_UPS``): generic questions that mean nothing without
the turn before. Assistant turns are stand-ins (``answer_to``); only their equality matters.

Scored pair by pair (``score_cases``): each case asks whether the system would serve the
stored conversation's answer to the query, for
- GPTCache's keying (GPTCache 0.1.44: ``Cache.init``'s default ``pre_embedding_func`` is
  ``last_content``, the last message's content; ``all_content`` joins every message's content
  with newlines), by cosine alone;
- PromptEdge's: the semantic scope (``cache.semantic.scope.semantic_query``: the whole conversation
  before the last user turn must be identical) and the last turn by similarity, + the rules,
  + the learned verifier.
Pure but for the encoder passed in.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from cache.semantic.scope import SemanticQuery, semantic_query
from cache.training.eval import GPTCACHE_DEFAULT_COSINE
from cache.verify.features import feature_matrix
from cache.verify.learned import LearnedVerifier
from cache.verify.rules import verify

Kind = Literal["other_context", "other_question_same_answer", "paraphrased_context", "same_context"]
KINDS: tuple[Kind, ...] = ("other_context", "other_question_same_answer", "paraphrased_context", "same_context")

# Follow-ups whose answer depends on the question before them (written for this set).
FOLLOW_UPS = (
    "How long does it take?",
    "Why is that?",
    "Can you give me an example?",
    "What are the alternatives?",
    "Is it expensive?",
    "What should I do first?",
    "Can you explain that more simply?",
    "What are the risks?",
    "Where can I learn more about it?",
    "Is it worth it?",
    "What do most people get wrong about it?",
    "How do I know if it worked?",
)


@dataclass(frozen=True)
class Case:
    """One stored conversation and one query conversation (OpenAI ``messages`` lists, each
    ending with a user turn); label 1 = the stored conversation's answer is right for the query."""

    kind: Kind
    stored: list[dict[str, str]]
    query: list[dict[str, str]]
    label: int


def answer_to(question: str) -> str:
    """The stand-in assistant turn after ``question``: an opaque token of it (the set compares
    turns, not answers; one that repeated the question would make a joined-text key look more
    like the question than a real answer does, or less)."""
    return "answer " + hashlib.blake2b(question.encode(), digest_size=6).hexdigest()


def _turns(question: str, answer: str, last: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": last},
    ]


def build_cases(
    text_a: Sequence[str], text_b: Sequence[str], labels: Sequence[int], per_kind: int, seed: int = 0
) -> list[Case]:
    """Up to ``per_kind`` cases of each kind from labelled pairs (text_a[i], text_b[i], labels[i]
    in {0, 1}), drawn with ``seed``: other_context and other_question_same_answer from the pairs
    labelled 0 (two draws), paraphrased_context from those labelled 1, same_context from any
    pair with another pair's text_a as the shared earlier question. Deterministic for the same
    input and seed. Pairs with an empty text, or two texts equal but for surrounding space, are
    left out (such a "different" pair would make identical conversations labelled different).
    Raises ValueError when the usable pairs hold no positive or no negative."""
    rng = random.Random(seed)
    usable = [
        i
        for i in range(len(labels))
        if text_a[i].strip() and text_b[i].strip() and text_a[i].strip() != text_b[i].strip()
    ]
    negatives = [i for i in usable if labels[i] == 0]
    positives = [i for i in usable if labels[i] == 1]
    if not negatives or not positives:
        raise ValueError("a multi-turn set needs pairs labelled 0 and pairs labelled 1")
    cases: list[Case] = []
    for i in rng.sample(negatives, min(per_kind, len(negatives))):
        follow_up = rng.choice(FOLLOW_UPS)
        cases.append(
            Case(
                "other_context",
                _turns(text_a[i], answer_to(text_a[i]), follow_up),
                _turns(text_b[i], answer_to(text_b[i]), follow_up),
                0,
            )
        )
    for i in rng.sample(negatives, min(per_kind, len(negatives))):
        follow_up, answer = rng.choice(FOLLOW_UPS), answer_to(text_a[i])
        cases.append(
            Case(
                "other_question_same_answer",
                _turns(text_a[i], answer, follow_up),
                _turns(text_b[i], answer, follow_up),
                0,
            )
        )
    for i in rng.sample(positives, min(per_kind, len(positives))):
        follow_up = rng.choice(FOLLOW_UPS)
        answer = answer_to(text_a[i])  # the first turn's answer came from the cache: the same
        cases.append(
            Case("paraphrased_context", _turns(text_a[i], answer, follow_up), _turns(text_b[i], answer, follow_up), 1)
        )
    everyone = usable
    for i in rng.sample(everyone, min(per_kind, len(everyone))):
        j = rng.choice(everyone)
        context, answer = text_a[j], answer_to(text_a[j])
        cases.append(
            Case("same_context", _turns(context, answer, text_a[i]), _turns(context, answer, text_b[i]), int(labels[i]))
        )
    return cases


def last_content(messages: Sequence[dict[str, str]]) -> str:
    """GPTCache's default key text: the last message's content."""
    return messages[-1]["content"]


def all_content(messages: Sequence[dict[str, str]]) -> str:
    """GPTCache's ``all_content`` key text: every message's content joined by newlines."""
    return "\n".join(m["content"] for m in messages)


def scope_of(messages: list[dict[str, str]]) -> SemanticQuery | None:
    """The semantic scope and text of a chat conversation as the cache computes them
    (``cache.semantic.scope.semantic_query``, one tenant, model "eval"); None when it is not eligible."""
    found = semantic_query("chat.completions", {"model": "eval", "messages": messages}, tenant="eval")
    return found if isinstance(found, SemanticQuery) else None


def score_cases(
    cases: Sequence[Case],
    encode: Callable[[list[str]], np.ndarray],
    threshold: float,
    verifier: LearnedVerifier | None = None,
    probability: float | None = None,
    precision_target: float | None = None,
    batch_size: int = 64,
) -> list[dict[str, Any]]:
    """Rows of (system, kind) -> precision, recall, hit rate, correct, wrong, miss, for every
    kind and ``"all"``. ``encode`` maps texts to unit vectors (n, dim); ``threshold`` is
    PromptEdge's cosine threshold (also the one at which the GPTCache keyings are shown beside
    their default 0.60); the learned-verifier rows need ``verifier`` and its ``probability``
    threshold (for ``precision_target``, named in the row)."""
    texts = sorted(
        {
            t
            for c in cases
            for conv in (c.stored, c.query)
            for t in (last_content(conv), all_content(conv), *_earlier_user_turns(conv))
        }
    )
    vectors = np.concatenate([encode(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)])
    vec = dict(zip(texts, vectors, strict=True))

    def cosine(key: Callable[[Sequence[dict[str, str]]], str]) -> np.ndarray:
        return np.array([float(vec[key(c.stored)] @ vec[key(c.query)]) for c in cases])

    last, joined = cosine(last_content), cosine(all_content)
    scoped = np.array(
        [
            (s := scope_of(c.stored)) is not None and (q := scope_of(c.query)) is not None and s.scope == q.scope
            for c in cases
        ]
    )
    rules = np.array([verify(last_content(c.query), last_content(c.stored)).ok for c in cases])
    by_meaning = np.array([_context_by_meaning(c, vec, threshold) for c in cases])
    systems: list[tuple[str, str, np.ndarray]] = [
        ("gptcache default (last message)", f"cosine >= {GPTCACHE_DEFAULT_COSINE}", last >= GPTCACHE_DEFAULT_COSINE),
        ("last message only", f"cosine >= {threshold}", last >= threshold),
        ("all messages joined (gptcache all_content)", f"cosine >= {threshold}", joined >= threshold),
        ("promptedge: scope + similarity", f"context identical, cosine >= {threshold}", scoped & (last >= threshold)),
        (
            "promptedge: + rules (the default)",
            f"context identical, cosine >= {threshold}, rules",
            scoped & (last >= threshold) & rules,
        ),
    ]
    if verifier is not None and probability is not None:
        kept = scoped & (last >= verifier.min_cosine)
        probs = np.zeros(len(cases))
        if kept.any():
            rows = feature_matrix(
                [(last_content(cases[i].query), last_content(cases[i].stored)) for i in np.nonzero(kept)[0]], last[kept]
            )
            probs[kept] = verifier.probability_of_rows(rows)
        systems.append(
            (
                "promptedge: + learned verifier",
                f"context identical, cosine >= {verifier.min_cosine}, p >= {probability:.4f}"
                + (f" (target {precision_target})" if precision_target is not None else ""),
                kept & (probs >= probability),
            )
        )
    systems.append(
        (
            "what-if: earlier user turns by meaning too",
            f"other turns identical, each user turn cosine >= {threshold} and rules (not built)",
            by_meaning & (last >= threshold) & rules,
        )
    )
    label = np.array([c.label == 1 for c in cases])
    kinds = np.array([c.kind for c in cases])
    out: list[dict[str, Any]] = []
    for name, rule, hit in systems:
        for kind in (*KINDS, "all"):
            mask = np.ones(len(cases), dtype=bool) if kind == "all" else kinds == kind
            out.append(_row(name, rule, kind, hit[mask], label[mask]))
    return out


def _earlier_user_turns(messages: Sequence[dict[str, str]]) -> list[str]:
    return [m["content"] for m in messages[:-1] if m["role"] == "user"]


def _context_by_meaning(case: Case, vec: dict[str, np.ndarray], threshold: float) -> bool:
    """Would a scope that compares earlier user turns by meaning (cosine >= threshold and the
    rules, each turn with its counterpart) and everything else exactly take the two contexts
    as one? A what-if for the eval: the cache requires the context verbatim."""
    stored, query = case.stored, case.query

    def blank(conv: list[dict[str, str]]) -> list[dict[str, str]]:
        return [m if m["role"] != "user" or i == len(conv) - 1 else {**m, "content": ""} for i, m in enumerate(conv)]

    if len(stored) != len(query):
        return False
    scope, other = scope_of(blank(stored)), scope_of(blank(query))
    if scope is None or other is None or scope.scope != other.scope:
        return False
    return all(
        a == b or (float(vec[a] @ vec[b]) >= threshold and verify(b, a).ok)
        for a, b in zip(_earlier_user_turns(stored), _earlier_user_turns(query), strict=True)
    )


def _row(system: str, rule: str, kind: str, hit: np.ndarray, label: np.ndarray) -> dict[str, Any]:
    correct, wrong, n, positives = int((hit & label).sum()), int((hit & ~label).sum()), len(hit), int(label.sum())
    hits = correct + wrong
    return {
        "system": system,
        "rule": rule,
        "kind": kind,
        "cases": n,
        "positives": positives,
        "correct": correct,
        "wrong": wrong,
        "miss": n - hits,
        "precision": round(correct / hits, 4) if hits else None,
        "recall": round(correct / positives, 4) if positives else None,
        "hit_rate": round(hits / n, 4) if n else 0.0,
    }


def format_rows(rows: Sequence[dict[str, Any]], source: str) -> str:
    """The rows as an aligned text table, one block per system."""
    lines = [
        f"{source}: multi-turn context set (pairwise: would the stored conversation's answer be served?)",
        f"{'system / kind':44} {'cases':>6} {'prec':>6} {'recall':>6} {'hit rate':>8} {'correct':>7} "
        f"{'wrong':>6} {'miss':>6}",
    ]
    for r in rows:
        name = r["system"] if r["kind"] == KINDS[0] else ""
        if name:
            lines.append(f"{name}  [{r['rule']}]")
        prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
        recall = "-" if r["recall"] is None else f"{r['recall']:.3f}"
        lines.append(
            f"  {r['kind']:42} {r['cases']:>6} {prec:>6} {recall:>6} {r['hit_rate']:>8.3f} "
            f"{r['correct']:>7} {r['wrong']:>6} {r['miss']:>6}"
        )
    return "\n".join(lines)

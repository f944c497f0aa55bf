"""Semantic scope of a request: what must be identical for a semantic hit, and the text compared
by meaning (pure).

A semantic hit requires everything but the text compared to be identical, by the exact key's
rule (cache/keys.py): the same tenant, endpoint, pool, body ``model``, every body field that is
not known to be neutral (defaults filled in), the system prompt and earlier turns (the whole
conversation before the last user message) and every field of the last user message but its
text. Only the text of the last user turn (of a completions prompt: the prompt) is compared by
meaning. Requests the semantic stage cannot judge safely are cached exactly or not at all, with
the reason counted:

- ``non_text``: the last user turn is not plain text (images, audio, file parts);
- ``tools``: tools are offered or the conversation carries tool calls / tool results (the answer
  may be a call whose arguments depend on exact wording);
- ``not_user_last``: the conversation does not end with a user message;
- ``prompt_not_text``: a completions prompt that is not one string (token ids, batches);
- ``too_long``: the compared text is longer than the encoder reads (it would be truncated, so
  differences past the cut would be invisible);
- ``empty``: nothing to compare;
- ``echo``: the answer repeats the prompt (``echo``, vLLM's ``prompt_logprobs``), so an answer
  for another wording would show another client's prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cache.keys import KEY_VERSION, canonical_messages, canonical_params, digest
from cache.types import Endpoint


@dataclass(frozen=True)
class SemanticQuery:
    """scope: hex digest of everything that must match exactly; text: the last user turn."""

    scope: str
    text: str


@dataclass(frozen=True)
class Skip:
    """The request is not eligible for semantic matching; reason is one of the module's codes."""

    reason: str


def semantic_query(
    endpoint: Endpoint, body: Mapping[str, Any], tenant: str, max_chars: int = 1000, pool: str | None = None
) -> SemanticQuery | Skip:
    """Split a request into its scope digest and the text compared by meaning, or say why not.

    max_chars: longest text compared (all-MiniLM-L6-v2 reads 256 word pieces, roughly 1,000
    characters of English); pool: the pool that answers (None = the body's ``model``). Never
    raises on odd content.
    """
    if endpoint == "embeddings":  # the embedding of a paraphrase is not this text's embedding
        return Skip("endpoint")
    if body.get("echo") not in (None, False) or body.get("prompt_logprobs") is not None:
        return Skip("echo")
    if endpoint == "chat.completions":
        messages = canonical_messages(body.get("messages"))
        if body.get("tools") or any(m.get("role") == "tool" or "tool_calls" in m or "raw" in m for m in messages):
            return Skip("tools")
        if not messages or messages[-1].get("role") != "user":
            return Skip("not_user_last")
        text = messages[-1].get("content")
        if not isinstance(text, str):
            return Skip("non_text")
        # the last message's other fields (``name``, extensions) must match too
        context: Any = [*messages[:-1], {k: v for k, v in messages[-1].items() if k != "content"}]
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return Skip("prompt_not_text")
        text, context = prompt, None
    text = text.strip()
    if not text:
        return Skip("empty")
    if len(text) > max_chars:
        return Skip("too_long")
    scope = digest(
        {
            "v": KEY_VERSION,
            "kind": "semantic",
            "tenant": tenant,
            "endpoint": endpoint,
            "pool": body.get("model") if pool is None else pool,
            "model": body.get("model"),
            "context": context,
            "params": canonical_params(endpoint, body),
        }
    )
    return SemanticQuery(scope=scope, text=text)

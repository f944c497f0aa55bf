"""Prompt token counts with each pool's own tokenizer (``PROMPTEDGE_ROUTER_TOKENIZERS``).

A pool whose served model's ``tokenizer.json`` (Hugging Face ``tokenizers`` format, the file
vLLM loads) is configured gets real counts for rate limits, lanes and size classes; any other
pool, or a tokenizer that cannot be read, keeps the chars / 4 estimate (router/forward/classify.py).
Chat prompts count their texts' tokens plus 3 per message and 3 for reply priming (the
framing of the chat template, as in the estimate). Text beyond ``_INLINE_CHARS`` is encoded on a
worker thread, so a long prompt does not hold the event loop; a count is an admission
estimate: the replica's ``usage`` replaces it when the answer comes (router/forward/ratelimit.py
``settle``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from router.forward.classify import estimate_prompt_tokens

log = logging.getLogger(__name__)
_INLINE_CHARS = 8192  # below this, encoding takes well under a millisecond: done in place
_FRAMING = 3  # tokens per chat message, and for the reply priming


def _texts(body: Mapping[str, Any]) -> tuple[list[str], int] | None:
    """The texts of a prompt and the framing tokens around them; None when the prompt is not
    text (token ids, odd shapes): the estimate counts those."""
    messages = body.get("messages")
    if isinstance(messages, list):
        texts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                texts.append(content)
            elif isinstance(content, list):
                texts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return texts, _FRAMING * len(messages) + _FRAMING
    prompt = body.get("prompt", body.get("input"))
    if isinstance(prompt, str):
        return [prompt], 0
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt), 0
    return None


class PromptTokens:
    """Counts prompt tokens per pool. tokenizers: pool -> a loaded ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizers: Mapping[str, Tokenizer] | None = None) -> None:
        self.tokenizers = dict(tokenizers or {})

    @classmethod
    def load(cls, files: Mapping[str, Path]) -> PromptTokens:
        """Read each pool's ``tokenizer.json`` (truncation and padding off: they would cap or
        pad the count); one that cannot be read is logged at ERROR and that pool keeps the
        estimate (fail safe: admission never depends on a file)."""
        loaded = {}
        for pool, path in files.items():
            try:
                tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:  # tokenizers raises a bare Exception for a missing or bad file
                log.error("tokenizer of pool %s not loaded from %s (%s): chars / 4 estimate instead", pool, path, exc)
                continue
            # a count, not model input: a file's truncation (an encoder's 128 or 512) would cap it
            tokenizer.no_truncation()
            tokenizer.no_padding()
            loaded[pool] = tokenizer
        return cls(loaded)

    async def count(self, pool: str, body: Mapping[str, Any]) -> int:
        """Prompt tokens of ``body`` as ``pool``'s model counts them, else the estimate."""
        tokenizer = self.tokenizers.get(pool)
        parts = _texts(body) if tokenizer is not None else None
        if tokenizer is None or parts is None:
            return estimate_prompt_tokens(body)
        texts, framing = parts
        if sum(len(t) for t in texts) <= _INLINE_CHARS:
            return _encode(tokenizer, texts) + framing
        return await asyncio.to_thread(_encode, tokenizer, texts) + framing


def _encode(tokenizer: Tokenizer, texts: list[str]) -> int:
    if not texts:
        return 0
    return sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))

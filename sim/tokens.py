"""The simulator's notion of a token.

Output: one sim token is one filler word followed by a space, so a completion of ``n`` tokens
is exactly ``n`` words. Prompt: there is no tokenizer; prompt tokens are estimated with
OpenAI's rule of thumb of ~4 characters per token (help.openai.com, "What are tokens and how
to count them?"), plus 3 tokens of framing per chat message and 3 to prime the reply
(the per-message overhead in OpenAI's cookbook "How to count tokens with tiktoken").
"""

from __future__ import annotations

import math
from collections.abc import Iterable

_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua"
).split()

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3


def estimate_text_tokens(text: str) -> int:
    """Estimated tokens in ``text``: ceil(chars / 4), at least 1."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def estimate_chat_tokens(contents: Iterable[str]) -> int:
    """Estimated prompt tokens of a chat: text estimate + 3 per message + 3 for reply priming."""
    total = REPLY_PRIMING_TOKENS
    for content in contents:
        total += TOKENS_PER_MESSAGE + math.ceil(len(content) / CHARS_PER_TOKEN)
    return total


def filler(start: int, count: int) -> str:
    """Filler tokens ``start .. start+count-1`` of a completion; each is one word plus a space."""
    return "".join(_WORDS[i % len(_WORDS)] + " " for i in range(start, start + count))

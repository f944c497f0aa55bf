"""The simulator's notion of a token.

Output: one sim token is one filler word followed by a space, so a completion of ``n`` tokens
is exactly ``n`` words. Prompt: there is no tokenizer; prompt tokens are estimated with
OpenAI's rule of thumb of ~4 characters per token (help.openai.com, "What are tokens and how
to count them?"), plus 3 tokens of framing per chat message and 3 to prime the reply
(the per-message overhead in OpenAI's cookbook "How to count tokens with tiktoken").

Token ids (for ``/tokenize`` and the prefix cache, sim/replica/latency/prefix.py): a text token is up to 4
characters, its id those characters' UTF-8 bytes read as one big-endian integer
(:func:`text_token_ids`); a chat prompt is, per message, 3 framing ids (message start, the
role, separator) then its content's ids, and 3 priming ids at the end
(:func:`chat_token_ids`), so its length is exactly :func:`estimate_chat_tokens` and equal
message prefixes give equal token-id prefixes.
"""

from __future__ import annotations

import hashlib
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


# Framing ids lie above every text id (a text id is at most 16 UTF-8 bytes: < 2**128).
_MESSAGE_START, _SEPARATOR, _REPLY_START = 2**128, 2**128 + 1, 2**128 + 2


def text_token_ids(text: str) -> list[int]:
    """Sim token ids of ``text``: one per 4 characters (ceil(len / 4) of them)."""
    return [int.from_bytes(text[i : i + CHARS_PER_TOKEN].encode(), "big") for i in range(0, len(text), CHARS_PER_TOKEN)]


def _role_id(role: str) -> int:
    return 2**128 + 16 + int.from_bytes(hashlib.blake2b(role.encode(), digest_size=6).digest(), "big")


def chat_token_ids(messages: Iterable[tuple[str, str]]) -> list[int]:
    """Token ids of a chat prompt from its (role, content) pairs in order: 3 framing ids and
    the content's ids per message, then 3 reply-priming ids (see the module docstring)."""
    ids: list[int] = []
    for role, content in messages:
        ids += (_MESSAGE_START, _role_id(role), _SEPARATOR)
        ids += text_token_ids(content)
    ids += (_REPLY_START, _role_id("assistant"), _SEPARATOR)
    return ids

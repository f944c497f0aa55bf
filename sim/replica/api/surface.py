"""The rest of vLLM's API surface the router forwards: ``POST /v1/embeddings``, ``/tokenize``,
``/detokenize`` and ``/v1/responses`` (pure bodies; the routes are registered by ``sim.replica.api.app``).

Responses are kept by the replica that made them (as vLLM keeps them in its memory), so a
``previous_response_id`` this replica does not hold is a 404.

The sim has no tokenizer: a sim token is up to 4 characters of text (the same count as its
prompt estimate, sim/replica/tokens.py), and its id is those characters' UTF-8 bytes read as one
big-endian integer, so ``/detokenize`` inverts ``/tokenize`` exactly. An embedding is a unit
vector of ``EMBEDDING_DIM`` floats drawn from the SHA-256 of the text: the same text always
gets the same vector, different texts different ones.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import time
import uuid
from typing import Any

from sim.replica.tokens import text_token_ids

EMBEDDING_DIM = 8


def tokenize(text: str) -> list[int]:
    """Sim token ids of ``text`` (one per 4 characters; sim/replica/tokens.py ``text_token_ids``)."""
    return text_token_ids(text)


def detokenize(tokens: list[int]) -> str:
    """The text of sim token ids; raises ValueError for an id that is no sim token."""
    return "".join(t.to_bytes(max(1, (t.bit_length() + 7) // 8), "big").decode() for t in tokens)


def embedding(text: str, dimensions: int | None = None) -> list[float]:
    """A unit vector for ``text`` (``dimensions`` floats, default EMBEDDING_DIM)."""
    size = dimensions or EMBEDDING_DIM
    raw = b"".join(hashlib.sha256(f"{k}:{text}".encode()).digest() for k in range(size // 8 + 1))
    values = [b / 127.5 - 1.0 for b in raw[:size]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [round(v / norm, 6) for v in values]


def embeddings_body(
    model: str, texts: list[str], encoding_format: str, dimensions: int | None, prompt_tokens: int
) -> dict[str, Any]:
    """OpenAI's embeddings answer: one ``embedding`` object per input, floats or base64 of
    little-endian float32 (``encoding_format``), ``usage`` with the prompt tokens."""
    data = []
    for index, text in enumerate(texts):
        vector: list[float] | str = embedding(text, dimensions)
        if encoding_format == "base64":
            vector = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": vector})
    return {
        "id": "embd-" + uuid.uuid4().hex,
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def response_body(
    response_id: str,
    model: str,
    text: str,
    previous: str | None,
    input_tokens: int,
    output_tokens: int,
    status: str = "completed",
) -> dict[str, Any]:
    """A Responses API ``response`` object with one assistant message of ``text``."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "previous_response_id": previous,
        "output": [
            {
                "type": "message",
                "id": "msg_" + response_id[5:],
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def response_event(kind: str, sequence: int, **fields: Any) -> bytes:
    """One Responses API SSE event: ``event: <kind>`` and its JSON ``data``."""
    data = json.dumps({"type": kind, "sequence_number": sequence, **fields}, separators=(",", ":"))
    return f"event: {kind}\ndata: {data}\n\n".encode()

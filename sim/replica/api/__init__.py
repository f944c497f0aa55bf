"""The simulated replica's HTTP surface (vLLM's OpenAI-compatible API, its /metrics and fault knobs).

- ``app``: the FastAPI app and its routes (:func:`create_app`);
- ``schemas``: the OpenAI request shapes it accepts and OpenAI-style error bodies;
- ``responses``: OpenAI response bodies and SSE chunks;
- ``output``: what an answer holds besides its text: reasoning, a tool call, logprobs (pure);
- ``surface``: embeddings, tokenize, detokenize and the Responses API (pure bodies).
"""

from sim.replica.api.app import create_app

__all__ = ["create_app"]

"""One simulated vLLM replica (``python -m sim serve``).

- ``api/``: the HTTP surface: the FastAPI app and its routes, OpenAI request shapes and error
  bodies, response bodies and SSE chunks, what an answer says (reasoning, tool calls,
  logprobs), and embeddings, tokenize and the Responses API;
- ``latency/``: the pure latency model: continuous batching over a KV cache, vLLM's prefix
  caching on token blocks, the GPU profiles;
- ``engine``: the asyncio loop that drives the latency model and publishes what each step made;
- ``metrics``: vLLM's Prometheus metrics; ``tokens``: the sim's notion of a token;
- ``settings``: the replica's settings; ``serving``: the server process and its graceful drain.

Public surface: :func:`create_app`, :class:`SimSettings`, :func:`build_replica`,
:func:`serve_replica`, :class:`ReplicaConfigError`.
"""

from sim.replica.api.app import create_app
from sim.replica.serving import ReplicaConfigError, build_replica, serve_replica
from sim.replica.settings import SimSettings

__all__ = ["ReplicaConfigError", "SimSettings", "build_replica", "create_app", "serve_replica"]

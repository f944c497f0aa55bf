"""OpenAI streaming (``stream: true``): server-sent events in both directions.

- ``deltas`` (pure): stream deltas <-> whole responses, by a generic merge (no field list);
- ``sse`` (pure): replay a cached answer as SSE chunks, assemble a streamed one, the
  ``include_usage`` filter;
- ``relay``: relay a replica's SSE stream to the client byte for byte while assembling it
  (timeouts, the lease, storing the answer: the request path's shell around ``sse``).

Import from the modules (``router.stream.sse``, ``router.stream.relay``): nothing is
re-exported here, so that the pure ``sse`` and ``deltas`` load without ``relay``'s request
path (httpx, the router's state).
"""

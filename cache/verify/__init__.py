"""Whether a near match may be served: the checks between "similar enough" and "served".

``rules`` (pure word-by-word vetoes: a negation, an order, a number that differs), ``features`` (a query/entry
pair as the learned verifier's inputs), ``learned`` (the learned verifier, read from
cache/models/verifier.json), ``model_file`` (reading the shipped model files), ``bound/`` (the
per-entry error bound). Training them is in cache/training/. Nothing is imported here: import
the submodule you need."""

"""Offline training and evaluation of the cache's models (``python -m cache eval``,
``train-verifier``, ``train-embedder``, ``fit-bound``, ``eval-bound``); serving code never
imports this package (an import-linter contract in pyproject.toml).

``eval`` (labelled pairs: loading them, scoring retrieval and verification), ``splits`` (the
fixed train/calibration/test split of the pairs), ``verifier`` (training the learned verifier),
``embedder`` (fine-tuning the embedding model and its thresholds), ``multiturn`` (the
multi-turn context set), ``bound_fit`` (fitting the per-entry bound's prior), ``bound_eval``
(replaying labelled lookups through the bound). Nothing is imported here: import the submodule
you need (most need scikit-learn or torch)."""

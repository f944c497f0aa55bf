"""The per-entry error bound for semantic hits (issue 14, item 2; off unless
``PROMPTEDGE_CACHE_ERROR_BOUND`` is set): instead of one cosine threshold, every semantic entry
carries its own decision boundary, a Bayesian offset on a pool calibration whose prior is fitted
offline, so the share of wrong answers among served hits stays at most the bound. ``model``
holds the pure model, its states and the serve/explore decision (and reads the shipped prior,
cache/models/entry_bound.json); ``region`` holds the binomial evidence behind the prior's
"region" mode (issue 34: serve only where the pool's labels vouch for the region, the learned
verifier's default); ``label`` turns a compared miss into a right/wrong label (pure); ``store``
keeps pool states, entry states and served-hit records in Redis. Offline, in cache/training/:
``bound_fit`` fits the prior (``python -m cache fit-bound``; ``fit-region-bound`` for the
region mode), ``bound_eval`` replays labelled lookups through the bound (``python -m cache eval-bound``). Nothing is
imported here: import the submodule you need (``model`` is light; ``store`` needs Redis)."""

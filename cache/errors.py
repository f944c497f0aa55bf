"""The cache's errors: one tree under ``CacheError``. Pure: no Redis import (redis-py's errors
become ``RedisFailed`` in cache/redis_errors.py, the one place that catches them).

    CacheError
    ├── CacheUnavailable       Redis did not answer within the bound, or failed
    │   └── RedisFailed        a Redis call raised (cache/redis_errors.py)
    ├── EmbeddingError         the embedding model cannot be loaded or fails (also RuntimeError)
    ├── EmbedderBusy           the embedder would not serve a text in time (also TimeoutError)
    ├── CorruptEntry           a stored semantic entry cannot be decoded (also ValueError)
    ├── VerifierError          the learned verifier's file or target is unusable (also ValueError)
    ├── BoundError             the entry bound's prior or a state is unusable (also ValueError)
    └── PairsFormatError       a labelled-pairs file cannot be read (also ValueError)

Each keeps the built-in base it had before the tree existed, so a caller that catches
``ValueError`` or ``TimeoutError`` still catches it; ``except CacheError`` catches all of them.
"""

from __future__ import annotations


class CacheError(Exception):
    """The root of every error the cache package raises on purpose."""


class CacheUnavailable(CacheError):
    """Redis did not answer within the bound, or failed; the request goes on uncached."""


class RedisFailed(CacheUnavailable):
    """A Redis call raised: a connection refused or lost, a socket timeout, a cluster without
    a node that answers, a command refused (``cache.redis_errors.redis_failures`` raises it). The message is
    the original error's; ``kind`` its class name (for logs); ``__cause__`` the original error."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.kind = type(error).__name__


class EmbeddingError(CacheError, RuntimeError):
    """The embedding model could not be loaded or failed to encode; the exact cache still works."""


class EmbedderBusy(CacheError, TimeoutError):
    """The embedder's queue would not be served within the caller's timeout: skip, do not wait."""


class CorruptEntry(CacheError, ValueError):
    """A semantic entry in Redis that cannot be decoded; it is skipped, counted and deleted."""


class VerifierError(CacheError, ValueError):
    """The verifier file is unusable, or a precision target is outside what it was calibrated
    for; the message names the file or the setting."""


class BoundError(CacheError, ValueError):
    """A prior file or a state that cannot be used; the message names the file or field."""


class PairsFormatError(CacheError, ValueError):
    """The pairs file cannot be read; the message names the file, item and field."""

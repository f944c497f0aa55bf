"""The semantic stage of the response cache: embed, search the local index, re-check in Redis,
verify, serve.

One SemanticCache per router worker. Its index is a derived copy of Redis: rebuilt at start,
then kept in sync by a follower task reading the change stream (inserts and deletes of every
worker). A candidate found in the index is served only after it was re-read from Redis and is
still there, unexpired, in the same scope, decodable, similar enough by its stored embedding
and accepted by verification; so a stale index can cost a hit but never serve a deleted or
expired entry.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import redis.asyncio as aioredis

from cache.embed.batching import BatchingEmbedder
from cache.embed.encoder import Encoder
from cache.embed.load import shared_encoder
from cache.errors import CorruptEntry, EmbedderBusy, EmbeddingError, RedisFailed
from cache.exact import is_complete_response
from cache.keys import digest, entry_key
from cache.redis_errors import redis_failures
from cache.semantic.index import ScopedIndex
from cache.semantic.scope import SemanticQuery
from cache.semantic.store import IndexEvent, SemanticStore, StoredEntry
from cache.settings import CacheSettings
from cache.verify.bound.model import decide
from cache.verify.bound.store import BoundStore, entry_state
from cache.verify.bound.store import pool_state as pool_state_of
from cache.verify.learned import LearnedVerifier
from cache.verify.rules import select
from opskit import masked

log = logging.getLogger("cache.semantic")  # its name before the module moved into cache/semantic/
T = TypeVar("T")
Bounded = Callable[[Awaitable[T]], Awaitable[T]]

_FOLLOW_BLOCK_MS = 1000
FOLLOW_SOCKET_TIMEOUT_S = _FOLLOW_BLOCK_MS / 1000 + 5  # the follower client's socket timeout
_HEAD_CHECK_S = 30.0
_STORE_EMBED_TIMEOUT_S = 5.0
INDEX_SLACK = 1024  # vectors an index may hold above max_entries until Redis's `del` events arrive
# The rebuild reads every entry; its client may have no socket timeout (ResponseCache's own),
# so a Redis that stops answering must not hold start-up or the follower forever.
_REBUILD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SemanticMatch:
    """A served semantic hit: the entry's response, its similarity, its Redis key and id, and
    ``score``: what the per-entry bound judged it by (the cosine with the rules, the learned
    verifier's calibrated probability with it; None: the same as ``similarity``)."""

    response: dict[str, Any]
    similarity: float
    key: str
    entry_id: str = ""
    score: float | None = None


@dataclass
class LookupReport:
    """What one semantic lookup saw, for the counters: the match (or None), why candidates
    above the threshold were not served (verification rule names, ``stale``, ``corrupt``) and
    why the search did not run (``skipped``: ``model_loading``, ``embed_busy``,
    ``embed_timeout``, ``embed_error``). explored: the candidate the per-entry bound did not
    serve, as (entry id, similarity, its cached response), to be compared with the replica's
    answer once the miss is answered (the middle value is the bound's score: the cosine with the
    rules, the learned verifier's probability with it)."""

    match: SemanticMatch | None = None
    rejected: Counter[str] = field(default_factory=Counter)
    skipped: str | None = None
    explored: tuple[str, float, dict[str, Any]] | None = None


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


class SemanticCache:
    """Semantic entries of one worker: encoder, local index, Redis store and the stream follower.

    state: "idle" -> "loading" -> "ready", or "failed" (``error`` says why; the exact cache keeps
    working and the router's /health reports degraded). encoder: inject one (tests, benchmarks);
    None uses the process-wide ``shared_encoder`` of ``settings.embedding_model`` (or
    ``embedding_package``), loaded in a thread at start. follow_redis: the client of the stream
    follower's blocking ``XREAD`` (its socket timeout must outlive the 1 s block:
    ``FOLLOW_SOCKET_TIMEOUT_S``); None: a copy of
    ``redis``'s connection settings with that timeout for a one-server client, ``redis`` itself
    for a Redis Cluster or Sentinel client (make one with ``opskit.redis_client.async_redis`` to bound it).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: CacheSettings,
        encoder: Encoder | None = None,
        follow_redis: aioredis.Redis | None = None,
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._given_follow_client = follow_redis
        self._encoder = encoder
        self.origin = uuid.uuid4().hex[:12]
        self.state = "idle"
        self.error: str | None = None
        self.embedder: BatchingEmbedder | None = None
        self.index: ScopedIndex | None = None
        self.store: SemanticStore | None = None
        self._start: asyncio.Task[None] | None = None
        self._follower: asyncio.Task[None] | None = None
        self._follow_client: aioredis.Redis | None = None
        self._last_id = "0-0"
        self.rebuilds = 0
        # (verifier, probability threshold) when settings.verifier is "learned", else the rules
        self._learned = settings.learned_verifier()
        prior = self._prior = settings.bound_prior()
        # the per-entry error bound (settings.error_bound), else None
        self.bound = None if prior is None else BoundStore(redis, settings.key_prefix, prior)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def learned(self) -> tuple[LearnedVerifier, float] | None:
        """The learned verifier and its probability threshold, loaded once at construction
        (``settings.learned_verifier()``), or None with ``verifier`` "rules"."""
        return self._learned

    def ensure_started(self) -> None:
        """Start loading in the background if nobody did (lookups before that skip semantics)."""
        if self._start is None:
            self._start = asyncio.create_task(self._start_once())

    async def start(self) -> None:
        """Load the encoder, rebuild the index from Redis and follow the change stream; returns
        when done (the same work however often it is called).

        Never raises: a model that cannot be loaded sets state "failed"; a Redis failure during
        the rebuild is retried by the follower.
        """
        self.ensure_started()
        assert self._start is not None
        await asyncio.shield(self._start)

    def _fail(self, reason: str) -> None:
        """State "failed" for good, with ``reason`` on one line and the model setting's secret
        parts masked (it may quote the setting, and /health and /cache/stats show it)."""
        self.state = "failed"
        self.error = " ".join(masked(reason).splitlines())  # masked first: a secret may hold a line break
        log.error("semantic cache disabled: %s", self.error)

    async def _start_once(self) -> None:
        self.state = "loading"
        s = self.settings
        try:
            encoder = self._encoder or await asyncio.to_thread(
                shared_encoder,
                s.embedding_model,
                s.embedding_threads,
                s.embed_backend,
                s.onnx_cache_dir,
                s.embedding_package,
                s.embed_precision,
            )
        except EmbeddingError as exc:
            self._fail(str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - the loaders' libraries raise their own types: the stage fails, never the start
            self._fail(f"cannot load embedding model: {type(exc).__name__}: {exc}")
            return
        # an injected encoder (tests, benchmarks) is the caller's business; the configured one
        # must be the model whose cosines the verifier and the bound's prior were fitted on
        mismatch = (
            None if self._encoder else s.embedder_mismatch(self._learned[0] if self._learned else None, self._prior)
        )
        if mismatch is not None:
            self._fail(mismatch)
            return
        self.embedder = BatchingEmbedder(
            encoder, window_s=s.embed_window_s, max_batch=s.embed_max_batch, lanes=s.lanes(), nice=s.embed_nice
        )
        try:
            # the first forward pass allocates and is many times slower: pay it here, not in a lookup
            await self.embedder.warm_up()
        except Exception as exc:  # noqa: BLE001 - a model that loads but cannot encode (a tokenizer id past its vocabulary: IndexError) fails the stage, not the start
            self._fail(f"embedding model fails to encode: {type(exc).__name__}: {exc}")
            return
        # Redis decides eviction (fair between tenants) and every worker follows its `del` events;
        # the index's own soonest-expiring eviction is a memory safety net INDEX_SLACK above it,
        # so it does not pre-empt Redis's choice while an `add` waits for its `del`.
        self.index = ScopedIndex(encoder.dim, max_entries=s.max_entries + INDEX_SLACK)
        self.store = SemanticStore(
            self._redis,
            prefix=s.key_prefix,
            dim=encoder.dim,
            max_entries=s.max_entries,
            stream_maxlen=s.stream_maxlen,
            origin=self.origin,
        )
        self._follow_client = self._given_follow_client or self._own_follow_client()
        try:
            with redis_failures():
                await self._rebuild()
        except RedisFailed as exc:
            log.warning("semantic index rebuild failed (%s); the follower retries", exc.kind)
            self._last_id = ""
        self.state = "ready"
        self._follower = asyncio.create_task(self._follow())

    def _own_follow_client(self) -> aioredis.Redis | None:
        """A one-server client like ``redis`` with the follower's socket timeout; None (use
        ``redis`` itself) for a cluster or Sentinel client, whose pools cannot be copied so."""
        pool = getattr(self._redis, "connection_pool", None)
        if type(pool) is not aioredis.ConnectionPool:
            return None
        kwargs = dict(pool.connection_kwargs)
        kwargs["socket_timeout"] = FOLLOW_SOCKET_TIMEOUT_S  # XREAD BLOCK outlives short timeouts
        return aioredis.Redis(connection_pool=aioredis.ConnectionPool(connection_class=pool.connection_class, **kwargs))

    async def _rebuild(self) -> None:
        """Reload the index from Redis; raises what redis-py raises, or TimeoutError (after
        _REBUILD_TIMEOUT_S): callers run it inside ``redis_failures``."""
        assert self.store is not None and self.index is not None
        async with asyncio.timeout(_REBUILD_TIMEOUT_S):
            tail = await self.store.stream_tail()  # before the scan: replaying overlap is idempotent
            live = await self.store.scan_live()
        self.index.clear()
        for entry_id, scope, vector, expires_at in live:
            self.index.add(entry_id, scope, vector, expires_at)
        self._last_id = tail
        self.rebuilds += 1

    async def _follow(self) -> None:
        assert self.index is not None
        reader = SemanticStore(
            self._follow_client or self._redis,
            prefix=self.settings.key_prefix,
            dim=self.index.dim,
            max_entries=self.settings.max_entries,
            stream_maxlen=self.settings.stream_maxlen,
            origin=self.origin,
        )
        backoff = 0.5
        next_head_check = time.monotonic() + _HEAD_CHECK_S
        task = asyncio.current_task()
        while True:
            # close() cancels this task, but a cancellation that arrives while redis-py reads a
            # reply can be swallowed there (turned into a connection error that its retry or
            # the handler below absorbs): the loop then went on for ever and close() never
            # returned. A cancel request stays visible in cancelling(): honour it every turn.
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            try:
                with redis_failures():
                    if not self._last_id:
                        await self._rebuild()
                    if time.monotonic() >= next_head_check:
                        next_head_check = time.monotonic() + _HEAD_CHECK_S
                        head = await reader.stream_head()
                        if self._last_id != "0-0" and _stream_id(head) > _stream_id(self._last_id):
                            log.warning("semantic index fell behind the trimmed stream; rebuilding")
                            await self._rebuild()
                    for event in await reader.read_events(self._last_id, _FOLLOW_BLOCK_MS):
                        self._apply(event)
                        self._last_id = event.stream_id
                    self.index.drop_expired(time.time())
                    backoff = 0.5
            except RedisFailed as exc:
                log.warning("semantic index follower: %s; retrying in %.1f s", exc.kind, backoff)
                self._last_id = ""  # events may be lost while down: rebuild on reconnect
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _apply(self, event: IndexEvent) -> None:
        assert self.index is not None
        if event.origin == self.origin:
            return  # applied locally when it happened
        if event.op == "add" and event.vector is not None and event.vector.shape == (self.index.dim,):
            if event.expires_at > time.time():
                self.index.add(event.entry_id, event.scope, event.vector, event.expires_at)
        elif event.op == "del":
            self.index.remove(event.entry_id)

    async def _embed(self, text: str, timeout_s: float) -> np.ndarray | str:
        """The text's vector, or why there is none: ``embed_busy``, ``embed_timeout``, ``embed_error``."""
        assert self.embedder is not None
        try:
            return await self.embedder.embed(text, timeout_s)
        except EmbedderBusy:
            return "embed_busy"  # expected under overload: counted, not logged per request
        except TimeoutError:
            log.warning("embedding took longer than %.2f s", timeout_s)
            return "embed_timeout"
        except EmbeddingError as exc:
            log.warning("embedding failed: %s", exc)
            return "embed_error"

    async def lookup(
        self,
        query: SemanticQuery,
        threshold: float,
        bounded: Bounded,
        pool: str = "",
        rules_threshold: float | None = None,
    ) -> LookupReport:
        """Find a served-safe entry of query.scope with similarity >= threshold that the
        verification stage accepts: with ``settings.verifier`` "learned" (the default), the
        first candidate whose calibrated probability reaches the precision target's threshold
        and that no rule vetoes (cache/verify/learned.py ``select``; rejections counted
        ``learned``); with "rules", the rules (cache/verify/rules.py ``select``).
        With ``settings.error_bound``, the rules' choice is served only when its entry's
        bound says so (cache/verify/bound/model.py ``decide``, with the state of ``pool``, read in
        the candidates' round trip; rejections counted ``bound``).

        With ``settings.verifier`` "rules+learned" (issue 34), the rules at ``rules_threshold``
        (the model's cosine threshold) first, then, when they serve nothing, the learned
        verifier's choice at ``rescue_precision_target`` among the candidates from ``threshold``
        (its cosine prefilter).

        bounded: wraps each Redis round trip with the cache's timeout (raises CacheUnavailable).
        """
        report = LookupReport()
        if not self.ready:
            report.skipped = f"model_{self.state}"
            return report
        assert self.index is not None and self.store is not None
        vector = await self._embed(query.text, self.settings.embed_timeout_s)
        if isinstance(vector, str):
            report.skipped = vector
            return report
        found = [
            n
            for n in self.index.search(query.scope, vector, self.settings.semantic_candidates)
            if n.similarity >= threshold
        ]
        if not found:
            return report
        # with the per-entry bound, its pool's counts come in the same round trip
        pool_key = self.bound.pool_key(pool) if self.bound is not None else None
        entries, pool_raw = await bounded(self.store.get_many_and_hash([n.entry_id for n in found], pool_key))
        now = time.time()
        valid: list[tuple[str, float, StoredEntry]] = []
        for neighbour, entry in zip(found, entries, strict=True):
            if isinstance(entry, CorruptEntry) or (entry is not None and not is_complete_response(entry.response)):
                report.rejected["corrupt"] += 1
                self.index.remove(neighbour.entry_id)
                log.warning("skipping corrupt semantic entry %s", neighbour.entry_id)
                await bounded(self.store.delete_ids([neighbour.entry_id]))
                continue
            if entry is None or entry.expires_at <= now or entry.scope != query.scope:
                report.rejected["stale"] += 1
                self.index.remove(neighbour.entry_id)
                continue
            # Redis's vector, not the index copy, decides
            valid.append((neighbour.entry_id, float(entry.embedding @ vector), entry))
        valid.sort(key=lambda item: -item[1])
        valid = [item for item in valid if item[1] >= threshold]
        score: float | None = None  # the bound's score of the chosen candidate
        if self._learned is not None and self.settings.verifier == "rules+learned" and self.bound is None:
            texts = [(e.text, sim) for _, sim, e in valid]
            cut = self.settings.rules_threshold if rules_threshold is None else rules_threshold
            chosen, rejected = select(query.text, texts, cut, self.settings.candidate_margin)
            report.rejected.update(rejected)
            if chosen is None and texts:
                verifier, probability = self._learned
                # the rules counted their vetoes already: only the verifier's refusals here
                refused: Counter[str] = Counter()
                chosen, _ = verifier.select(
                    query.text, texts, probability, self.settings.candidate_margin, True, refused
                )
                report.rejected["learned"] += refused["learned"]
        elif self._learned is not None and self.settings.verifier == "learned":
            verifier, probability = self._learned
            if self.bound is not None:
                # the bound decides on the verifier's probability: search down to its floor
                probability = self.bound.prior.floor
            texts = [(e.text, sim) for _, sim, e in valid]
            # the rules veto, except under the bound: there a veto sent its search down to
            # another entry's candidate, and its error on GPTCache's pairs rose (docs/benchmarks.md)
            vetoes = self.bound is None
            chosen, _ = verifier.select(
                query.text, texts, probability, self.settings.candidate_margin, vetoes, report.rejected
            )
            if chosen is not None:
                score = verifier.probability(query.text, *texts[chosen])
        else:
            chosen, rejected = select(
                query.text, [(e.text, sim) for _, sim, e in valid], threshold, self.settings.candidate_margin
            )
            report.rejected.update(rejected)
        if chosen is not None and self.bound is not None and self.settings.error_bound is not None:
            _, similarity, entry = valid[chosen]
            score = similarity if score is None else score
            pool_state = pool_state_of(pool_raw, len(self.bound.prior.knots))
            state = entry_state(entry.bound, self.bound.prior)
            if decide(self.bound.prior, score, state, pool_state, self.settings.error_bound) != "serve":
                report.rejected["bound"] += 1
                report.explored = (valid[chosen][0], score, entry.response)
                chosen = None
        if chosen is not None:
            entry_id, similarity, entry = valid[chosen]
            report.match = SemanticMatch(
                entry.response, round(similarity, 4), entry_key(self.store.prefix, entry_id), entry_id, score
            )
        return report

    async def store_entry(
        self,
        query: SemanticQuery,
        *,
        tenant: str,
        model: str,
        response: dict[str, Any],
        ttl_s: int,
        bounded: Bounded,
        group: str | None = None,
    ) -> bool:
        """Write one entry (fixed TTL) and index it here; False when not ready or not embeddable.
        ``group``: the tenant's statistics label, the unit of fair eviction (cache/semantic/store.py)."""
        if not self.ready:
            return False
        assert self.index is not None and self.store is not None
        # a store is off the client's critical path: it may wait longer than a lookup
        vector = await self._embed(query.text, max(self.settings.embed_timeout_s, _STORE_EMBED_TIMEOUT_S))
        if isinstance(vector, str):
            return False
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        entry_id = digest([query.scope, query.text])[:32]
        now = time.time()
        evicted = await bounded(
            self.store.put(
                entry_id,
                scope=query.scope,
                text=query.text,
                tenant=tenant,
                model=model,
                response=response,
                vector=vector,
                ttl_s=ttl_s,
                now=now,
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                group=group,
            )
        )
        for victim in evicted:  # Redis chose them (fairly): drop them before adding here
            self.index.remove(victim)
        for victim in self.index.add(entry_id, query.scope, vector, now + ttl_s):
            self.index.remove(victim)
        return True

    async def delete(self, tenant: str | None, model: str | None) -> int:
        """Delete the entries of a tenant and/or model from Redis and this index (others follow
        the stream). Works without the model loaded. Raises redis errors."""
        store = self.store or SemanticStore(
            self._redis,
            prefix=self.settings.key_prefix,
            dim=0,
            max_entries=self.settings.max_entries,
            stream_maxlen=self.settings.stream_maxlen,
            origin=self.origin,
        )
        deleted = await store.delete_where(tenant, model)
        if self.index is not None:
            for entry_id in deleted:
                self.index.remove(entry_id)
        return len(deleted)

    async def close(self) -> None:
        """Stop the follower and the encoder thread."""
        for task in (self._start, self._follower):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        if self.embedder is not None:
            self.embedder.close()
        if self._follow_client is not None and self._given_follow_client is None:
            await self._follow_client.aclose()  # its own; a given client is its owner's to close

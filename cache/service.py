"""ResponseCache: the one object the router talks to (lookup, store, delete, stats)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio as aioredis

from cache.embed.encoder import Encoder
from cache.errors import CacheUnavailable, RedisFailed
from cache.exact import ExactStore, expected_choices, is_complete_response, usage_tokens
from cache.keys import entry_key, exact_key
from cache.redis_errors import redis_failures
from cache.semantic.cache import SemanticCache
from cache.semantic.scope import Skip, semantic_query
from cache.settings import CacheSettings
from cache.stats import metrics
from cache.stats.store import LookupEvent, PendingCounts, StatsStore
from cache.types import CacheHit, CacheRequest, Outcome
from cache.verify.bound.label import compared_label
from cache.verify.bound.store import pool_name, query_text
from cache.warming.popularity import Popularity

log = logging.getLogger(__name__)
T = TypeVar("T")

# After a Redis failure, requests skip the cache for this long instead of each paying the timeout.
_RETRY_AFTER_S = 1.0
_ADMIN_TIMEOUT_S = 30.0
# Work off the client's path (a store, which writes more than a lookup reads: the entry, its
# vector, the stream event; the stats writes; the stats read) is bounded by at least this:
# bounding it by the lookup's budget (50 ms by default) made one slow write mark Redis down and
# turn every lookup off for _RETRY_AFTER_S.
_OFF_PATH_TIMEOUT_S = 1.0
# Candidates the per-entry bound explored, kept until their miss is stored (then compared with
# the replica's answer): at most this many, for at most this long.
_EXPLORED_MAX = 4096
_EXPLORED_TTL_S = 300.0


FUTURE_SKEW_S = 60.0  # a replica's clock may run this far ahead of ours; further is no time at all


def age_s(response: dict[str, Any], now: float | None = None) -> float | None:
    """Seconds since the replica created ``response`` (its ``created``, Unix s), at least 0;
    None when it has no numeric ``created``, or one that is no time (``NaN``, ``Infinity``, a
    JSON number past the float range) or more than ``FUTURE_SKEW_S`` in the future: a replica
    that says so does not make its answer fresh for every ``max-age`` (nor an ``Age`` header
    that cannot be written)."""
    created = response.get("created")
    if type(created) not in (int, float):
        return None
    now = time.time() if now is None else now
    try:
        age = now - float(created)
    except OverflowError:  # an int beyond the float range
        return None
    if not math.isfinite(age) or age < -FUTURE_SKEW_S:
        return None
    return max(0.0, age)


def fresh(response: dict[str, Any], max_age_s: int | None) -> bool:
    """True when ``response`` may be served to a client accepting answers up to ``max_age_s``
    seconds old (None: any age); an answer of unknown age is not fresh for a bounded client."""
    if max_age_s is None:
        return True
    age = age_s(response)
    return age is not None and age <= max_age_s


class ResponseCache:
    """Exact, then semantic, response cache over Redis.

    lookup() and store() never raise for Redis trouble: each round trip is bounded by
    ``settings.redis_timeout_s``; on failure the request is served uncached, ``healthy`` turns
    False (the router's /health reports degraded) and Redis is tried again after 1 s. The
    semantic stage loads its model at ``start()`` (or lazily on the first lookup); if the model
    cannot be loaded the exact stage keeps working and ``healthy`` stays False.

    encoder: an already loaded Encoder to share (tests, benchmarks); None loads the configured
    model. bounded_redis: the client for the entries (exact and semantic), the stats and
    warming (default: ``redis``); its socket timeout also bounds the calls made outside this
    class's own bounds (the warmer's, the index rebuild at start-up). exact_redis: the client
    for the exact lookup's GET and the store's script only (default: ``bounded_redis``), each
    of which this class bounds itself, so it can do without a socket timeout, which redis-py
    (8.x, Python 3.11) implements with ``asyncio.wait_for``: a Task per command.
    follow_redis: the semantic index follower's client (SemanticCache; its socket timeout
    ``cache.semantic.cache.FOLLOW_SOCKET_TIMEOUT_S``); the caller closes it. Any of these clients
    may be a one-server, Redis Cluster or Sentinel client (``opskit.redis_client.async_redis``):
    every script and transaction here touches keys of one hash slot (cache/README.md).
    clock: Unix seconds for the warming counts' time-of-day slots (the router's clock, which
    may be simulated; default ``time.time``).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: CacheSettings | None = None,
        encoder: Encoder | None = None,
        bounded_redis: aioredis.Redis | None = None,
        follow_redis: aioredis.Redis | None = None,
        clock: Callable[[], float] | None = None,
        exact_redis: aioredis.Redis | None = None,
    ) -> None:
        self.settings = settings or CacheSettings()
        client = bounded_redis or redis
        self._exact = ExactStore(client, self.settings.key_prefix, hot_redis=exact_redis)
        self._stats = StatsStore(client, self.settings.key_prefix)
        # predictive warming (cache/warming/): counts and recipes, only for pools that enable it
        self.popularity = Popularity(client, self.settings.key_prefix)
        self.clock = clock or time.time
        self._counting: set[asyncio.Task[None]] = set()
        # the semantic stage too: every call of it is bounded here (or, the index rebuild, in
        # SemanticCache), and the router's 0.25 s socket timeout turned one slow semantic write
        # under load into a cache marked down for a second
        self.semantic = (
            SemanticCache(client, self.settings, encoder, follow_redis) if self.settings.semantic_enabled else None
        )
        self._redis_ok = True
        self._down_until = 0.0
        self._pending = PendingCounts()
        self._flusher: asyncio.Task[None] | None = None
        self._client = client
        self._prober: asyncio.Task[None] | None = None
        # request digest -> (entry id, similarity, cached response, monotonic time)
        self._explored: OrderedDict[str, tuple[str, float, dict[str, Any], float]] = OrderedDict()

    @property
    def healthy(self) -> bool:
        """False while Redis is failing or when the embedding model could not be loaded."""
        return self._redis_ok and (self.semantic is None or self.semantic.state != "failed")

    async def start(self, wait: bool = True) -> None:
        """Start the background health probe, load the embedding model and rebuild the semantic
        index (call from the app's lifespan).

        wait=False returns at once and loads in the background: until ready, lookups are
        exact-only and counted as skipped (``model_loading``).
        """
        if self._prober is None:
            self._prober = asyncio.create_task(self._probe_loop())
        if self.semantic is None:
            return
        if wait:
            await self.semantic.start()
        else:
            self.semantic.ensure_started()

    async def aclose(self) -> None:
        """Write the counts not yet in Redis, then stop background work (index follower,
        encoder thread)."""
        if self._counting:  # warming counts of hits already served (each bounded)
            await asyncio.gather(*self._counting, return_exceptions=True)
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
            self._prober = None
        await self.flush_stats()
        if self.semantic is not None:
            await self.semantic.close()

    async def probe(self) -> bool:
        """PING Redis now, bounded like work off the client's path, whether or not Redis is
        marked down; sets ``healthy``'s Redis part from the answer (and on success lets lookups
        use Redis again at once). Returns it; never raises."""
        try:
            async with asyncio.timeout(self._off_path_timeout_s):
                with redis_failures():
                    await self._client.ping()
        except (TimeoutError, RedisFailed):
            self._redis_ok = False
            return False
        if not self._redis_ok:
            log.warning("cache available again: Redis answers")
        self._redis_ok = True
        self._down_until = 0.0
        return True

    async def _probe_loop(self) -> None:
        # Without it, an idle router stayed "degraded" after Redis came back until a request
        # happened to reach the cache (issue 13, finding 9).
        task = asyncio.current_task()
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.probe()
            # probe() bounds the PING with asyncio.timeout and absorbs its errors: a cancel
            # (aclose) that lands as the bound expires must still end the loop
            if task is not None and task.cancelling():
                raise asyncio.CancelledError

    @property
    def _off_path_timeout_s(self) -> float:
        return max(self.settings.redis_timeout_s, _OFF_PATH_TIMEOUT_S)

    async def _bounded(self, op: Awaitable[T], timeout_s: float | None = None) -> T:
        if time.monotonic() < self._down_until:
            if asyncio.iscoroutine(op):
                op.close()
            raise CacheUnavailable("redis marked down")
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the call in a Task of
            # its own, a measurable share of the router's CPU per request (bench/router_overhead.py)
            async with asyncio.timeout(self.settings.redis_timeout_s if timeout_s is None else timeout_s):
                with redis_failures():
                    result = await op
        except (TimeoutError, RedisFailed) as exc:
            self._redis_ok = False
            self._down_until = time.monotonic() + _RETRY_AFTER_S
            kind = exc.kind if isinstance(exc, RedisFailed) else exc.__class__.__name__
            log.warning("cache unavailable: %s in %s", kind, getattr(op, "__qualname__", "redis call"))
            raise CacheUnavailable(str(exc)) from exc
        self._redis_ok = True
        return result

    def _key(self, req: CacheRequest) -> str:
        return exact_key(self.settings.key_prefix, req.endpoint, req.body, req.tenant, req.digest, req.pool)

    def _saved(self, response: dict[str, Any]) -> tuple[int, float]:
        prompt, completion = usage_tokens(response.get("usage")) or (0, 0)
        s = self.settings
        return prompt + completion, prompt / s.prefill_tokens_per_s + completion / s.decode_tokens_per_s

    async def lookup(self, req: CacheRequest) -> CacheHit | None:
        """The cached response for req, or None (miss, no-cache, disabled or Redis unavailable).

        Exact first; on an exact miss, the semantic stage unless ``req.control.semantic`` is
        False (same scope, similarity >= the threshold for the model or the request's override,
        which cannot go below ``settings.min_request_threshold``; verified). Counts the outcome
        per model (the pool that answers) and tenant label (``req.label``) in Redis
        (``no-cache`` lookups count as misses).
        """
        if not self.settings.enabled:
            return None
        started = time.perf_counter()
        hit: CacheHit | None = None
        skipped: str | None = None
        rejected: Counter[str] = Counter()
        try:
            if not req.control.no_cache:
                key = self._key(req)
                corrupt_before = self._exact.corrupt
                raw = await self._bounded(self._exact.get_raw(key))
                response = self._exact.decode(key, raw)
                if self._exact.corrupt > corrupt_before:
                    rejected["corrupt"] += 1  # skipped like a miss; counted with the semantic ones
                if response is not None and not fresh(response, req.control.max_age_s):
                    rejected["max_age"] += 1  # older than the client accepts: a miss for it
                    response = None
                if response is not None:
                    hit = CacheHit(kind="exact", response=response, similarity=None, key=key, raw=raw)
                    if self.settings.warming:
                        self._count_hit(req, key)
                elif self.semantic is not None and not req.control.semantic:
                    skipped = "exact_only"  # the request's policy (e.g. a client without a key)
                elif self.semantic is not None:
                    hit, skipped = await self._semantic_lookup(req, rejected)
        except CacheUnavailable:
            hit = None
        outcome: Outcome = hit.kind if hit else "miss"
        tokens, replica_s = self._saved(hit.response) if hit else (0, 0.0)
        event = LookupEvent(
            req.model, req.label, outcome, hit.similarity if hit else None, tokens, replica_s, skipped, rejected
        )
        metrics.observe(event, time.perf_counter() - started)
        # counted after the answer, not before it: no round trip on the lookup's path, and the
        # lookups that finish while a write is in flight share the next write
        self._pending.add(event, time.time())
        if (self._flusher is None or self._flusher.done()) and time.monotonic() >= self._down_until:
            self._flusher = asyncio.create_task(self._write_pending())
        return hit

    def _count_hit(self, req: CacheRequest, key: str) -> None:
        """Count an exact hit of a pool with warming on, after the answer (a task: no round trip
        on the hit's path); a hit on a warmed entry is counted apart (``warm_hits``)."""
        warming = self.settings.warming_for(req.model)
        if warming is None or req.control.no_store:  # a request the cache would not store is not kept
            return

        async def count() -> None:
            try:
                await self._bounded(self.popularity.record(req, key, warming, self.clock()), self._off_path_timeout_s)
                if await self._bounded(self.popularity.marked(key), self._off_path_timeout_s):
                    metrics.WARM_HITS.labels(req.model).inc()
            except CacheUnavailable:
                pass

        task = asyncio.create_task(count())
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    async def _write_pending(self) -> None:
        while self._pending:
            taken = self._pending.take()
            try:
                await self._bounded(self._stats.record_pending(taken), self._off_path_timeout_s)
            except CacheUnavailable:
                self._pending.restore(taken)  # what is not in Redis yet waits for the next write
                return

    async def flush_stats(self) -> None:
        """Wait until the counts of lookups already answered are in Redis (or their write
        failed: then they are kept for the next one). Never raises."""
        if self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
        if self._pending and time.monotonic() >= self._down_until:
            self._flusher = asyncio.create_task(self._write_pending())
            await asyncio.shield(self._flusher)

    async def _semantic_lookup(self, req: CacheRequest, rejected: Counter[str]) -> tuple[CacheHit | None, str | None]:
        assert self.semantic is not None
        self.semantic.ensure_started()
        query = semantic_query(req.endpoint, req.body, req.tenant, self.settings.max_semantic_chars, req.pool)
        if isinstance(query, Skip):
            return None, query.reason
        if not self.semantic.ready:
            return None, f"model_{self.semantic.state}"
        rules_threshold = None
        learned = self.semantic.learned  # loaded at start: no file read per lookup
        prefilter = None if learned is None else learned[0].min_cosine
        if self.settings.error_bound is not None:
            # the bound decides; the similarity settings are not used: the search starts at the
            # prior's floor (a cosine) or the verifier's prefilter, which a request may raise
            if prefilter is not None and self.settings.verifier == "learned":
                floor = prefilter
            else:
                prior = self.settings.bound_prior()
                assert prior is not None
                floor = prior.floor
            threshold = max(floor, req.control.threshold or 0.0)
        elif self.settings.verifier == "rules+learned":
            # the learned verifier's prefilter, which a request may raise, and the rules' own
            # threshold (the model's), which the prefilter may go below
            assert prefilter is not None
            threshold = max(prefilter, req.control.threshold or 0.0)
            rules_threshold = self.settings.threshold_for(req.model, req.control.threshold)
            threshold = min(threshold, rules_threshold)
        else:
            # "rules": their cosine threshold; "learned": the cosine prefilter of its candidates
            threshold = self.settings.threshold_for(req.model, req.control.threshold, prefilter)
        report = await self.semantic.lookup(
            query, threshold, self._bounded, pool_name(req.tenant, req.model), rules_threshold
        )
        rejected.update(report.rejected)
        if report.explored is not None:
            self._explored[req.digest] = (*report.explored, time.monotonic())
            self._explored.move_to_end(req.digest)
            while len(self._explored) > _EXPLORED_MAX:
                self._explored.popitem(last=False)
        if report.match is None:
            return None, report.skipped
        match = report.match
        if not fresh(match.response, req.control.max_age_s):
            rejected["max_age"] += 1
            return None, None
        feedback_id = await self._remember_hit(req, match) if self.settings.feedback else None
        return CacheHit(
            kind="semantic",
            response=match.response,
            similarity=match.similarity,
            key=match.key,
            feedback_id=feedback_id,
            entry_id=match.entry_id,
            bound_score=match.score,
        ), None

    async def _remember_hit(self, req: CacheRequest, match: Any) -> str | None:
        """Record a semantic hit its tenant may report (one SET on the hit's path); its id, or
        None when Redis does not take it (the hit is served all the same)."""
        assert self.semantic is not None and self.semantic.bound is not None
        hit_id = os.urandom(16).hex()
        try:
            await self._bounded(
                self.semantic.bound.remember_hit(
                    hit_id,
                    match.entry_id,
                    req.tenant,
                    match.similarity if match.score is None else match.score,
                    self.settings.feedback_ttl_s,
                )
            )
        except CacheUnavailable:
            return None
        return hit_id

    async def report_wrong(self, hit_id: str, tenant: str) -> bool:
        """A client's report that the semantic hit ``hit_id`` served to ``tenant`` was wrong:
        the entry that answered learns it (cache/verify/bound/model.py ``update_entry``; the pool does
        not: a client cannot make other tenants' hits rarer). True when applied; False for an
        unknown, expired, already reported or another tenant's hit, an entry that is gone, or
        feedback off. Raises CacheUnavailable."""
        if not self.settings.feedback or self.semantic is None or self.semantic.bound is None:
            return False
        bound = self.semantic.bound
        claimed = await self._bounded(bound.claim_hit(hit_id, tenant), self._off_path_timeout_s)
        if claimed is None:
            return False
        entry_id, score = claimed
        model = await self._bounded(
            self._client.hget(entry_key(self.settings.key_prefix, entry_id), "model"), self._off_path_timeout_s
        )
        if model is None:
            return False
        pool = pool_name(tenant, model.decode() if isinstance(model, bytes) else str(model))
        state = await self._bounded(bound.report(entry_id, pool, score, right=False), self._off_path_timeout_s)
        return state is not None

    def ttl_for(self, req: CacheRequest) -> int:
        """TTL in seconds: the per-request override clamped to the bounds, else the default;
        then at most ``control.ttl_cap_s`` (how long the replica said its answer stays fresh)."""
        s = self.settings
        ttl = s.ttl_s if req.control.ttl_s is None else max(s.min_ttl_s, min(s.max_ttl_s, req.control.ttl_s))
        cap = req.control.ttl_cap_s
        return ttl if cap is None else max(1, min(ttl, cap))

    async def store(
        self, req: CacheRequest, response: dict[str, Any], raw: bytes | None = None, warmed: bool = False
    ) -> bool:
        """Store a complete, successful response (exact, and semantic when eligible); True when
        the exact entry was written. raw: ``response``'s JSON bytes as received, if at hand
        (stored as is instead of serialising ``response`` again). With the per-entry error
        bound, a candidate its lookup explored is then labelled by comparing answers.
        warmed: the answer is a warm generation (the router's warmer), marked as such and not
        counted as a request; a client's answer in a pool with warming on is counted.

        Refuses (False) errors, partial responses (a choice without finish_reason, fewer or
        other choices than the request's ``n`` per prompt), ``no-store`` requests, entries
        over ``max_entry_bytes`` and Redis failures.
        """
        if (
            not self.settings.enabled
            or req.control.no_store
            or not is_complete_response(response, expected_choices(req.endpoint, req.body))
        ):
            return False
        if raw is None:  # serialised here once, as ExactStore would: its size is the entry's
            raw = json.dumps(response, separators=(",", ":")).encode()
        if len(raw) > self.settings.max_entry_bytes:
            return False
        ttl_s = self.ttl_for(req)

        def bounded(op: Awaitable[T]) -> Awaitable[T]:
            return self._bounded(op, self._off_path_timeout_s)

        key = self._key(req)
        try:
            await bounded(self._exact.set(key, response, ttl_s, req.tenant, req.model, raw))
        except CacheUnavailable:
            return False
        warming = self.settings.warming_for(req.model) if self.settings.warming else None
        if warming is not None:
            try:
                if warmed:
                    await bounded(self.popularity.mark(key, ttl_s))
                else:
                    await bounded(self.popularity.unmark(key))
                    await bounded(self.popularity.record(req, key, warming, self.clock()))
            except CacheUnavailable:
                pass  # the entry is stored; a count or mark lost is no wrong answer
        if self.semantic is not None and self.semantic.ready and req.control.semantic:
            query = semantic_query(req.endpoint, req.body, req.tenant, self.settings.max_semantic_chars, req.pool)
            if not isinstance(query, Skip):
                try:
                    await self.semantic.store_entry(
                        query,
                        tenant=req.tenant,
                        model=req.model,
                        response=response,
                        ttl_s=ttl_s,
                        bounded=bounded,
                        group=req.label,
                    )
                except CacheUnavailable:
                    pass
        await self._learn_from_miss(req, response)
        return True

    async def _learn_from_miss(self, req: CacheRequest, response: dict[str, Any]) -> None:
        """A candidate the per-entry bound explored for ``req``, now that the replica answered:
        its cached answer compared with ``response`` labels the entry and the pool's step
        (``_learn``). Never raises."""
        explored = self._explored.pop(req.digest, None) if self._explored else None
        if explored is None:
            return
        entry_id, score, cached, at = explored
        if time.monotonic() - at > _EXPLORED_TTL_S:
            return
        await self._learn(req, entry_id, score, cached, response)

    async def verify_hit(self, req: CacheRequest, hit: CacheHit, response: dict[str, Any]) -> bool | None:
        """Shadow verification of a served semantic ``hit`` on ``req``: ``response`` is a
        replica's own answer to ``req``, obtained off the client's path (the router's, one
        replica call). The entry and its pool learn the label exactly as from a compared miss
        (``_learn``). True / False: the label given; None: none (an exact hit, the bound off, a
        sampled or several-choice request, answers without choices, this query already labelled
        this entry, Redis failing). Never raises."""
        if hit.kind != "semantic" or hit.entry_id is None or hit.similarity is None:
            return None
        score = hit.similarity if hit.bound_score is None else hit.bound_score
        return await self._learn(req, hit.entry_id, score, hit.response, response)

    async def _learn(
        self, req: CacheRequest, entry_id: str, score: float, cached: dict[str, Any], response: dict[str, Any]
    ) -> bool | None:
        """Label entry ``entry_id`` (found at cosine ``score``, holding ``cached``) by the
        replica's ``response`` to ``req`` (cache/verify/bound/label.py): one count in the pool's step
        and the entry's state, off the client's path, at most once per (entry, query) pair
        within ``settings.ttl_s`` (``BoundStore.count_once``). The label, or None when there is
        none (sampled request, bound off, the pair labelled already) or Redis did not take it.
        Never raises."""
        if self.semantic is None or self.semantic.bound is None:
            return None
        right = compared_label(req.body, cached, response)
        if right is None:
            return None
        bound = self.semantic.bound
        query = semantic_query(req.endpoint, req.body, req.tenant, self.settings.max_semantic_chars, req.pool)
        # the pair's identity: the text compared with the entry (a semantic candidate always has one)
        text = req.digest if isinstance(query, Skip) else query_text(query.text)
        try:
            pool = pool_name(req.tenant, req.model)
            # once per (entry, query) pair for TTL_S (cache/README.md, "Labels"): a repeat is no
            # new observation, and only a counted label teaches the entry
            counted = await self._bounded(
                bound.count_once(pool, score, right, entry_id, text, self.settings.ttl_s), self._off_path_timeout_s
            )
            if not counted:
                return None
            await self._bounded(bound.report(entry_id, pool, score, right), self._off_path_timeout_s)
        except CacheUnavailable:
            return None
        return right

    async def delete(self, tenant: str | None = None, model: str | None = None) -> dict[str, int]:
        """Delete the entries (exact and semantic) of a tenant and/or model; None matches any.

        Warming's recipes (prompts) and counts of the tenant/model are deleted too, whatever the
        warming settings are now: those kept while warming was on live ``history_days + 1`` days.
        Returns {"exact": n, "semantic": n}, plus ``"warming": n`` (recipes deleted with their
        counts) when some pool has warming configured or some recipe was deleted. Raises
        CacheUnavailable (bounded by 30 s).
        """
        exact = await self._bounded(self._exact.delete_where(tenant, model), _ADMIN_TIMEOUT_S)
        semantic = 0
        if self.semantic is not None:
            semantic = await self._bounded(self.semantic.delete(tenant, model), _ADMIN_TIMEOUT_S)
        deleted = {"exact": exact, "semantic": semantic}
        # the prompts kept for warming go with the entries, also after warming was switched off
        # (a SCAN of the warm:recipe keys, on every primary of a cluster)
        forgotten = await self._bounded(self.popularity.forget(tenant, model), _ADMIN_TIMEOUT_S)
        if self.settings.warming or forgotten:
            deleted["warming"] = forgotten
        return deleted

    async def stats(self) -> dict[str, Any]:
        """The ``/cache/stats`` JSON (see StatsStore.read) plus ``semantic`` {state, error,
        entries indexed here}; raises CacheUnavailable. This worker's lookups so far are in it."""
        await self.flush_stats()
        out = await self._bounded(self._stats.read(), self._off_path_timeout_s)
        sem = self.semantic
        out["semantic"] = {
            "state": "disabled" if sem is None else sem.state,
            "error": None if sem is None else sem.error,
            "indexed": 0 if sem is None or sem.index is None else len(sem.index),
        }
        return out

"""Operational routes: /health, /v1/models (and /v1/models/{id}), /metrics, /cache/stats, DELETE /cache."""

from __future__ import annotations

import hmac
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from cache import CacheUnavailable, metrics_text
from router.deps import StateDep
from router.dispatch import lanes
from router.errors import APIError, BadRequest, Forbidden, ModelNotFound, RedisUnavailable, Unauthorized
from router.fleet.replicas import Replica
from router.forward.classify import api_key
from router.redis_errors import redis_failures

ops = APIRouter()


class CacheStatsUnavailable(APIError):
    """503: the cache (statistics, entries) lives in Redis, which does not answer."""

    status = 503
    type = "service_unavailable"


def _pool_health(replicas: list[Replica], now: float) -> dict[str, Any]:
    """``{"replicas", "ready"}`` of one pool; a pool with replicas reserved for long prompts
    (router/dispatch/lanes.py) adds ``"lanes": {lane: {"replicas", "ready"}}``."""
    ready = [(r.spec.role, r.health.admits(now)) for r in replicas]
    entry: dict[str, Any] = {"replicas": len(ready), "ready": sum(up for _, up in ready)}
    if any(role != lanes.NORMAL for role, _ in ready):
        entry["lanes"] = lanes.readiness(ready)
    return entry


def _pool_ok(entry: dict[str, Any]) -> bool:
    """A ready replica in the pool and in each of its lanes."""
    return entry["ready"] > 0 and all(lane["ready"] > 0 for lane in entry.get("lanes", {}).values())


@ops.get("/health")
async def health(state: StateDep) -> dict[str, Any]:
    """200 with ``status`` ok | degraded (Redis down, the cache's embedding model failed to
    load, a pool without a ready replica, or a pool's lane, e.g. its ``long`` replicas, without
    one: ``pools[model]["lanes"][lane]["ready"] == 0``); ``semantic``: the semantic stage's state
    (ready | failed | disabled: the router listens once the model has loaded or failed);
    ``semantic_error``: why it failed, on one line, credentials masked (the same text as the log
    line and ``/cache/stats``), else None. ``cache`` is False when either Redis or the semantic
    stage fails: while only the semantic stage has failed, exact hits are still served."""
    try:
        with redis_failures():
            redis_ok = bool(await state.redis.ping())
    except RedisUnavailable:
        redis_ok = False
    now = time.monotonic()
    pools = {model: _pool_health(replicas, now) for model, replicas in state.pools.by_model.items()}
    cache_ok = redis_ok and state.cache.healthy  # False too when the embedding model failed
    ok = cache_ok and all(_pool_ok(p) for p in pools.values())
    semantic = state.cache.semantic
    return {
        "status": "ok" if ok else "degraded",
        "redis": redis_ok,
        "cache": cache_ok,
        "semantic": "disabled" if semantic is None else semantic.state,
        "semantic_error": None if semantic is None else semantic.error,
        "pools": pools,
    }


def _model_entry(model: str, replicas: list[Replica], now: float) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "created": 0,
        "owned_by": "promptedge",
        "replicas": len(replicas),
        "ready": sum(r.health.admits(now) for r in replicas),
    }


@ops.get("/v1/models")
async def models(state: StateDep) -> dict[str, Any]:
    """OpenAI model list: one entry per pool, with its replica counts."""
    now = time.monotonic()
    return {
        "object": "list",
        "data": [_model_entry(model, replicas, now) for model, replicas in state.pools.by_model.items()],
    }


@ops.get("/v1/models/{model:path}")
async def model(state: StateDep, model: str) -> dict[str, Any]:
    """One pool's entry of the model list (ids may hold slashes, ``org/name``); 404
    ``model_not_found`` for a model the router has no pool of."""
    replicas = state.pools.by_model.get(model)
    if replicas is None:
        raise ModelNotFound(f"The model `{model}` does not exist.", param="model", code="model_not_found")
    return _model_entry(model, replicas, time.monotonic())


@ops.get("/metrics")
async def metrics(state: StateDep) -> Response:
    """Prometheus text exposition of the router's and the cache's series."""
    body = state.metrics.render()
    if state.metrics.shared is None:  # shared: the cache's series are among every worker's already
        body += metrics_text()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


@ops.get("/cache/stats")
async def cache_stats(state: StateDep, request: Request) -> JSONResponse:
    """The cache's counters (requests, exact/semantic hits, misses, hit ratio, per model).

    ``per_tenant`` (tenant names and their traffic, in the totals and in every window) only
    for ``Authorization: Bearer <PROMPTEDGE_ROUTER_ADMIN_KEY>``; any other caller gets the rest."""
    try:
        stats = await state.cache.stats()
    except CacheUnavailable:
        raise CacheStatsUnavailable(
            "cache statistics unavailable: Redis does not answer", code="redis_unavailable"
        ) from None
    if not _is_admin(state.settings.admin_key, request):
        stats = without_tenants(stats)
    return JSONResponse(stats)


def _is_admin(admin_key: str | None, request: Request) -> bool:
    """True if the request's bearer token is the (set, non-blank) admin key."""
    if admin_key is None or not admin_key.strip():
        return False
    return hmac.compare_digest(api_key(request.headers).encode(), admin_key.encode())


def without_tenants(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` (cache/stats/store.py shape) without ``per_tenant``, in the totals and every window."""
    out = {k: v for k, v in stats.items() if k != "per_tenant"}
    windows = stats.get("windows")
    if isinstance(windows, dict):
        out["windows"] = {
            name: {k: v for k, v in w.items() if k != "per_tenant"} if isinstance(w, dict) else w
            for name, w in windows.items()
        }
    return out


@ops.delete("/cache")
async def delete_cache(
    state: StateDep, request: Request, tenant: str | None = None, model: str | None = None, all: bool = False
) -> dict[str, Any]:
    """Delete cache entries (exact and semantic) of a tenant and/or model, or ``all=true``.

    Needs ``Authorization: Bearer <PROMPTEDGE_ROUTER_ADMIN_KEY>`` (403 when no admin key is set
    or it is empty / blank, 401 for a wrong one). Returns {"deleted": {"exact": n, "semantic": n}, "tenant", "model"}.
    """
    admin_key = state.settings.admin_key
    if admin_key is None or not admin_key.strip():  # an empty key must not match an empty bearer
        raise Forbidden("cache deletion is switched off: set PROMPTEDGE_ROUTER_ADMIN_KEY", code="admin_disabled")
    if not hmac.compare_digest(api_key(request.headers).encode(), admin_key.encode()):
        raise Unauthorized("DELETE /cache needs the admin key as a bearer token", code="invalid_api_key")
    if tenant is None and model is None and not all:
        raise BadRequest("give tenant and/or model, or all=true", param="tenant", code="missing_filter")
    try:
        deleted = await state.cache.delete(tenant, model)
    except CacheUnavailable:
        raise CacheStatsUnavailable("cache unavailable: Redis does not answer", code="redis_unavailable") from None
    return {"deleted": deleted, "tenant": tenant, "model": model}

"""Pure reading of request metadata: cache controls, priority, API key, token estimates.

Header names (router/README.md): ``Cache-Control: no-cache | no-store | max-age=N | private``, ``X-Cache-TTL``
(seconds), ``X-Cache-Threshold`` (semantic similarity 0..1; 0 means 0), ``X-Priority``
(P0 | P1 | P2, default P1), ``X-Session-ID``, ``X-Model`` (pool override).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

from cache import CacheControl
from router.errors import BadRequest

PRIORITIES = ("P0", "P1", "P2")


def directives(value: str | None) -> frozenset[str]:
    """The directives of a ``Cache-Control`` header value, lower-cased (``max-age=60`` kept
    whole); empty for none."""
    return frozenset(d.strip().lower() for d in (value or "").split(",") if d.strip())


def cache_control(headers: Mapping[str, str]) -> CacheControl:
    """The cache controls of a request; raises BadRequest for a malformed TTL/threshold
    header or ``max-age``. ``Cache-Control`` as HTTP clients use it: ``no-cache`` (no cached
    answer), ``no-store`` (do not keep this one), ``max-age=N`` (no answer older than N s;
    ``max-age=0`` is ``no-cache``). ``private`` is read by :func:`is_private`."""
    found = directives(headers.get("cache-control"))
    ttl = _number(headers, "X-Cache-TTL", int)
    threshold = _number(headers, "X-Cache-Threshold", float)
    if ttl is not None and ttl < 0:
        raise BadRequest("X-Cache-TTL must be >= 0 seconds", param="X-Cache-TTL", code="invalid_header")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise BadRequest("X-Cache-Threshold must be within 0..1", param="X-Cache-Threshold", code="invalid_header")
    max_age = _max_age(found)
    if not (
        "no-cache" in found or "no-store" in found or ttl is not None or threshold is not None or max_age is not None
    ):
        return _DEFAULT
    return CacheControl(
        no_cache="no-cache" in found or max_age == 0,
        no_store="no-store" in found,
        ttl_s=ttl,
        threshold=threshold,
        max_age_s=max_age,
    )


def _max_age(found: frozenset[str]) -> int | None:
    for directive in found:
        name, _, value = directive.partition("=")
        if name.strip() == "max-age":
            value = value.strip().strip('"')
            # ASCII digits only ("\u00b2".isdigit() is true and int() refuses it); more digits
            # than int() reads (4300) or any age needs is 2**31 s (RFC 9111, section 1.2.2)
            if not value.isascii() or not value.isdigit():
                raise BadRequest(
                    "Cache-Control max-age must be a whole number of seconds >= 0",
                    param="Cache-Control",
                    code="invalid_header",
                )
            digits = value.lstrip("0")
            return int(digits or "0") if len(digits) <= 10 else 2**31
    return None


def is_private(headers: Mapping[str, str]) -> bool:
    """True for ``Cache-Control: private``: the answer is for this client alone (stored and
    served only for the same API key, exact stage only; not at all without a key)."""
    return "private" in directives(headers.get("cache-control"))


_DEFAULT = CacheControl()


def _number(headers: Mapping[str, str], name: str, kind: type[int] | type[float]) -> int | float | None:
    # name as documented: errors name the header as every other error about it does; headers
    # arrive lower-cased (Starlette's Headers and plain dicts alike)
    value = headers.get(name.lower())
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        raise BadRequest(f"header {name} must be a number, got {value!r}", param=name, code="invalid_header") from None


def api_key(headers: Mapping[str, str]) -> str:
    """The bearer token of ``Authorization`` ("" when there is none)."""
    value = headers.get("authorization", "")
    return value[7:].strip() if value[:7].lower() == "bearer " else ""


def tenant(key: str, mapping: Mapping[str, str]) -> str:
    """Cache tenant of an API key: the mapped name, else one tenant per key (``key:`` + the
    first 16 hex digits of its SHA-256, so the key itself never reaches Redis), ``default``
    for requests without a key. Two different keys never share cache entries unless mapped
    to the same tenant."""
    if key in mapping:
        return mapping[key]
    if not key:
        return ANONYMOUS
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]


ANONYMOUS = "default"  # the tenant (and label) of requests without an API key
OTHER = "other"  # the statistics/metrics label of every API key without a mapping


def tenant_label(key: str, mapping: Mapping[str, str]) -> str:
    """The tenant's name in statistics and metrics, from a bounded set: the mapped name,
    ``default`` without a key, and ``other`` for any key without a mapping (so random keys
    cannot each make a Prometheus series or a Redis stats field). Isolation uses ``tenant``."""
    if key in mapping:
        return mapping[key]
    return OTHER if key else ANONYMOUS


def anonymous_control(control: CacheControl, policy: str) -> CacheControl:
    """The cache controls of a request without an API key under the anonymous-cache policy
    (``PROMPTEDGE_ROUTER_ANONYMOUS_CACHE``): ``off`` = neither lookup nor store, ``exact``
    = exact stage only (an answer is shared only with the very same request), ``semantic`` =
    both stages, shared by all clients without a key."""
    if policy == "off":
        return CacheControl(no_cache=True, no_store=True)
    if policy == "exact":
        return replace(control, semantic=False)
    return control


def private_scope(key: str, control: CacheControl) -> tuple[str, CacheControl]:
    """The cache tenant and controls of a ``Cache-Control: private`` request: the key's own
    tenant (as an unmapped key's, so a mapped tenant's other keys never see it) and the exact
    stage only; without a key there is nobody to keep it for: neither lookup nor store."""
    if not key:
        return ANONYMOUS, CacheControl(no_cache=True, no_store=True)
    return tenant(key, {}), replace(control, semantic=False)


def max_output_tokens(body: Mapping[str, object]) -> int:
    """The output tokens a request may use: max_completion_tokens, else max_tokens, else the
    Responses API's max_output_tokens, else 0."""
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def priority(headers: Mapping[str, str]) -> str:
    """The request's priority class P0 (most important) .. P2; raises BadRequest if unknown."""
    value = headers.get("x-priority")
    if value is None:
        return "P1"
    value = value.strip().upper()
    if value not in PRIORITIES:
        raise BadRequest("X-Priority must be P0, P1 or P2", param="X-Priority", code="invalid_header")
    return value


ANY_TENANT = "*"  # max_priority's entry for requests without a key and keys without a mapping
UNLISTED_MAX_PRIORITY = "P1"  # what ANY_TENANT may claim unless max_priority says otherwise


def bounded_priority(claimed: str, key: str, mapping: Mapping[str, str], bounds: Mapping[str, str]) -> str:
    """The priority a request gets: the one it ``claimed`` (P0..P2), lowered to its tenant's
    bound. ``bounds`` (``PROMPTEDGE_ROUTER_MAX_PRIORITY``): tenant name or ``"*"`` -> highest
    class it may claim. A mapped key's tenant not in ``bounds`` may claim P0; a request without
    a key or with a key not in ``mapping`` is bounded by ``bounds["*"]`` (default P1), so an
    anonymous client cannot put itself ahead of the tenants (P0 is never shed)."""
    if key and key in mapping:
        bound = bounds.get(mapping[key], "P0")
    else:
        bound = bounds.get(ANY_TENANT, UNLISTED_MAX_PRIORITY)
    return max(claimed, bound)  # "P0" < "P1" < "P2": the larger name is the lower class


def estimate_prompt_tokens(body: Mapping[str, object]) -> int:
    """Prompt size in tokens without a tokenizer: ceil(chars / 4) (OpenAI's rule of thumb of
    ~4 characters per token) plus 3 per chat message and 3 for reply priming (OpenAI cookbook,
    "How to count tokens with tiktoken"); a pre-tokenised prompt counts its token ids; an
    embeddings ``input`` counts as a prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                # only text counts (validation refuses a non-string text: 400, messages.N.content.M.text)
                chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return -(-chars // 4) + 3 * len(messages) + 3
    prompt = body.get("prompt", body.get("input"))  # embeddings: ``input``
    if isinstance(prompt, str):
        return -(-len(prompt) // 4)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, list) else -(-len(str(p)) // 4) for p in prompt)
    return 0


def size_class(prompt_tokens: int, thresholds: tuple[int, int]) -> str:
    """``short`` (< thresholds[0] tokens), ``medium`` or ``long`` (>= thresholds[1])."""
    if prompt_tokens < thresholds[0]:
        return "short"
    return "long" if prompt_tokens >= thresholds[1] else "medium"

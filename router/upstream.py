"""HTTP to replicas: the client factory and the one place httpx errors are translated.

The transport is a setting (``upstream_transport``): ``aiohttp`` (the ``httpx-aiohttp``
transport) or ``httpx`` (httpx's own httpcore pool); ``bench/router_overhead.py`` measures
both, see router/README.md for the numbers behind the default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
from httpx_aiohttp import AiohttpTransport

from router.errors import UpstreamError, UpstreamTimeout

RETRYABLE_STATUS = frozenset({429, 503})


class ConnectFailed(UpstreamError):
    """The replica could not be reached (nothing was sent): safe to retry elsewhere."""


class RetryableStatus(UpstreamError):
    """The replica answered 429 or 503 before any byte reached the client: retry elsewhere."""


class Upstream:
    """Sends requests to replicas through one pooled httpx transport.

    transport: ``aiohttp`` (httpx-aiohttp) or ``httpx`` (httpcore). Requests go straight to the
    transport as ``httpx.Request`` objects: the client layer (auth, redirects, cookies, event
    hooks) has nothing to do for a proxy and costs a measurable share of a request.
    """

    def __init__(self, transport: str, max_connections: int) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.transport: httpx.AsyncBaseTransport = (
            AiohttpTransport(limits=limits) if transport == "aiohttp" else httpx.AsyncHTTPTransport(limits=limits)
        )
        self._urls: dict[str, httpx.URL] = {}

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self.transport.aclose()

    async def open(self, url: str, body: bytes, headers: dict[str, str], connect_timeout_s: float,
                   ttfb_timeout_s: float) -> httpx.Response:
        """POST ``body`` to ``url`` and return the response with its body not yet read.

        Timeouts in seconds. Raises ConnectFailed (unreachable), RetryableStatus (429/503), UpstreamTimeout (no
        response headers within ``ttfb_timeout_s``), UpstreamError (other transport errors).
        The caller must close the returned response.
        """
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        timeout = {"connect": connect_timeout_s, "read": ttfb_timeout_s, "write": connect_timeout_s, "pool": None}
        request = httpx.Request("POST", parsed, content=body, headers=headers, extensions={"timeout": timeout})
        try:
            response = await self.transport.handle_async_request(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ConnectFailed(f"replica {url} unreachable: {exc!r}", code="replica_unreachable") from None
        except httpx.TimeoutException:
            raise UpstreamTimeout(f"replica {url} sent no response within {ttfb_timeout_s} s",
                                  code="replica_timeout") from None
        except httpx.HTTPError as exc:
            raise UpstreamError(f"replica {url} failed: {exc!r}", code="replica_error") from None
        response.request = request
        if response.status_code in RETRYABLE_STATUS:
            await response.aclose()
            raise RetryableStatus(f"replica {url} answered {response.status_code}", code="replica_busy")
        return response


async def read_body(response: httpx.Response, url: str) -> bytes:
    """The whole body of an open response; translates transport errors (502/504)."""
    try:
        return await response.aread()
    except httpx.TimeoutException:
        raise UpstreamTimeout(f"replica {url} timed out sending its response", code="replica_timeout") from None
    except httpx.HTTPError as exc:
        raise UpstreamError(f"replica {url} broke off its response: {exc!r}", code="replica_error") from None
    finally:
        await response.aclose()


async def iter_body(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The raw body chunks of an open response; translates transport errors (502/504)."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.TimeoutException:
        raise UpstreamTimeout(f"replica {url} stream timed out", code="replica_timeout") from None
    except httpx.HTTPError as exc:
        raise UpstreamError(f"replica {url} broke off its stream: {exc!r}", code="replica_error") from None

"""The router's resource limits (one settings section, ``PROMPTEDGE_ROUTER_LIMITS``) and the pure
decisions made from them: the connection budget under the process's open-files limit.

Every limit bounds what one client can make the router hold (bytes, connections, time, CPU);
the table in router/README.md lists each with its default and the status a client sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

KIB = 1024
MIB = 1024 * KIB


class Limits(BaseModel):
    """Limits on one request and on connections (sizes in bytes, durations in seconds).

    max_body_bytes: request body (Content-Length, or chunked bytes as they arrive) -> 413;
    max_header_bytes: request line + headers -> 431; max_headers: header count -> 431;
    max_url_bytes: request target (path + query) -> 414; max_json_depth: nesting of the JSON
    body (the body object is level 1) -> 400; max_json_containers: objects + arrays in the JSON
    body, counted on the bytes before parsing (memory and parse time grow with them) -> 400;
    max_json_values: values in the body's arrays and objects (numbers, strings, containers),
    counted as the commas outside strings before parsing (validation, the key's digest and the
    walk cost CPU on the event loop per value) -> 400; max_messages: chat messages, or completion prompt
    items -> 400; max_output_tokens: ``max_tokens`` / ``max_completion_tokens`` -> 400;
    header_timeout_s: from a connection's first byte (or its opening) to the end of a request's
    headers -> connection closed; body_timeout_s: from the end of the headers to the end of the
    body -> 408; body_stall_s: at the connection cap, a connection whose body has not advanced
    for this long may be closed to make room -> 408; keepalive_timeout_s: idle time between requests on a connection -> closed;
    max_client_connections: open client connections, None = derived from RLIMIT_NOFILE
    (:func:`connection_budget`); health_reserve: connections above the cap that are served only
    for ``/health`` and ``/metrics`` while every connection under the cap has a request in flight.

    After a refusal that leaves part of the request unread (431 headers, 413 body, 408, 400),
    the answer is followed by a lingering close (router/process/linger.py): the router half-closes and
    discards what still arrives, so the client reads its answer instead of a reset, and closes
    when the client does or at the first of: lingering_max_bytes discarded, lingering_timeout_s
    without a byte, lingering_time_s after the answer (nginx's lingering_time and
    lingering_timeout, 30 s and 5 s there too; lingering_max_bytes 0 closes at the first byte
    that still arrives). Past a bound the client gets a reset, as before.
    """

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(8 * MIB, ge=1)
    max_header_bytes: int = Field(32 * KIB, ge=1 * KIB)
    max_headers: int = Field(100, ge=8)
    max_url_bytes: int = Field(8 * KIB, ge=256)
    max_json_depth: int = Field(64, ge=4, le=512)
    max_json_containers: int = Field(50_000, ge=64, le=1_000_000)
    max_json_values: int = Field(262_144, ge=1024, le=8 * MIB)
    max_messages: int = Field(2048, ge=1)
    max_output_tokens: int = Field(1_048_576, ge=1)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    body_stall_s: float = Field(5.0, gt=0)
    keepalive_timeout_s: float = Field(5.0, gt=0)
    max_client_connections: int | None = Field(None, ge=1)
    health_reserve: int = Field(16, ge=1)
    lingering_max_bytes: int = Field(256 * MIB, ge=0)
    lingering_timeout_s: float = Field(5.0, gt=0)
    lingering_time_s: float = Field(30.0, gt=0)


# Descriptors the process holds besides client and upstream connections: the listening socket,
# Redis clients (two pools), replica probes, log files, the embedding model's files, epoll.
OTHER_FDS = 128


@dataclass(frozen=True)
class ConnectionBudget:
    """How the open-files limit is shared: ``clients`` connections served normally, ``reserve``
    more only for /health and /metrics, ``upstream`` connections to replicas; ``note`` says what
    was reduced to fit (empty when nothing was)."""

    nofile: int
    clients: int
    reserve: int
    upstream: int
    note: str = ""


def connection_budget(nofile: int, limits: Limits, upstream_max: int) -> ConnectionBudget:
    """Share ``nofile`` open files (the soft RLIMIT_NOFILE) between client connections (cap plus
    health reserve), upstream connections (at most ``upstream_max``) and ``OTHER_FDS``, so that
    ``accept()`` never fails for want of a descriptor. A configured ``max_client_connections``
    is kept when it fits; otherwise clients and upstream get half of what is left each.
    Raises ValueError when ``nofile`` leaves no room for a single client connection."""
    room = nofile - OTHER_FDS - limits.health_reserve
    if room < 2:
        raise ValueError(
            f"RLIMIT_NOFILE {nofile} leaves no room for connections "
            f"({OTHER_FDS} other descriptors + {limits.health_reserve} reserved)"
        )
    configured = limits.max_client_connections
    wanted = configured if configured is not None else room - min(upstream_max, room // 2)
    if wanted + upstream_max <= room:
        return ConnectionBudget(nofile, wanted, limits.health_reserve, upstream_max)
    clients = min(wanted, room // 2)
    upstream = min(upstream_max, room - clients)
    note = (f"client connections {wanted} -> {clients}" if clients != wanted else "") + (
        f"{', ' if clients != wanted else ''}upstream connections {upstream_max} -> {upstream}"
        if upstream != upstream_max
        else ""
    )
    return ConnectionBudget(nofile, clients, limits.health_reserve, upstream, note)

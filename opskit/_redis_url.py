"""One place that turns a Redis URL into a redis-py client: one server, Redis Cluster or Sentinel.

Every PromptEdge process (router, cache CLI, forecaster) reads the same ``PROMPTEDGE_REDIS_URL``,
so the topology is part of the URL, not a second setting that could disagree with it:

| URL | client (redis-py's own) |
|---|---|
| ``redis://[[user]:password@]host:port[/db]``, ``rediss://...``, ``unix:///path?db=N`` | ``Redis.from_url`` (one server) |
| ``redis+cluster://[[user]:password@]host:port[,host:port...][/0]``, ``rediss+cluster://...`` | ``RedisCluster`` with those startup nodes |
| ``redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db][?sentinel_password=...]``, ``rediss+sentinel://...`` | ``Sentinel(...).master_for(service_name)`` |

Why a scheme and not a ``REDIS_CLUSTER=true`` flag: a redis-py user builds a cluster client with
``RedisCluster.from_url("redis://host:port")``, i.e. the scheme alone does not say "cluster"; the
``+cluster`` / ``+sentinel`` suffix (as Kombu/Celery's ``sentinel://`` and others do) keeps the
whole topology in the one shared setting. A cluster accepts only database 0. In a Sentinel URL,
the user name and password are the data nodes' (``requirepass``); ``sentinel_password`` (query)
is the sentinels' own, when they have one. Several hosts are comma-separated; any one that answers
is enough to discover the rest.

Passwords never reach a log: :func:`redact_url` and :attr:`RedisTarget.shown` replace user
information by ``***``, and :class:`RedisTarget` keeps the password out of its ``repr``.
This module is pure (no I/O, no redis import: settings modules that pure cores import use it);
the client builders are in ``opskit.redis_client``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from pydantic import AfterValidator

Topology = Literal["standalone", "cluster", "sentinel"]
_SCHEMES: dict[str, tuple[Topology, bool]] = {
    "redis": ("standalone", False),
    "rediss": ("standalone", True),
    "unix": ("standalone", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
# The sentinels answer small queries (who is the master); they get this bound unless the caller
# gives a smaller socket timeout.
SENTINEL_TIMEOUT_S = 0.5


class RedisURLError(ValueError):
    """A Redis URL that cannot be used; the message never repeats the URL (it may hold a password)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed Redis URL.

    topology: ``standalone`` | ``cluster`` | ``sentinel``; url: the URL as given (standalone: handed
    to ``Redis.from_url``); nodes: (host, port) of the cluster's startup nodes or of the sentinels;
    service: the Sentinel service (master) name; db: database number; ssl: TLS (``rediss``);
    username / password / sentinel_password: credentials (None: none), hidden from ``repr``.
    """

    topology: Topology
    url: str = field(repr=False)
    nodes: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    ssl: bool = False
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)

    @property
    def shown(self) -> str:
        """The URL for log lines and messages: user information replaced by ``***``."""
        return redact_url(self.url)


# Query options that are credentials: redis-py's from_url reads ``password`` as the password.
_SECRET_OPTIONS = frozenset({"password", "sentinel_password"})


def _redacted_option(item: str) -> str:
    name, sep, _ = item.partition("=")
    return f"{name}=***" if sep and unquote(name).lower() in _SECRET_OPTIONS else item


def redact_url(url: str) -> str:
    """``url`` with its user information (``user:password@``) replaced by ``***@`` and a
    ``password`` or ``sentinel_password`` query value (any case) by ``***``; a URL without either comes back unchanged, one
    that does not parse as ``***`` when it contains ``@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***" if "@" in url else url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(_redacted_option(item) for item in parts.query.split("&")) if parts.query else ""
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _hosts(text: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for item in text.split(","):
        host, sep, port = item.strip().rpartition(":")
        host = host.strip("[]")  # [::1]:6379
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisURLError("every host of a Redis Cluster or Sentinel URL needs host:port (port 1..65535)")
        nodes.append((host, int(port)))
    return tuple(nodes)


def parse_redis_url(url: str) -> RedisTarget:
    """The topology, nodes and credentials of a Redis URL (the module's table); pure.

    Raises RedisURLError for an unknown scheme, a bad host or port, a cluster URL with a
    database other than 0, or a Sentinel URL without a service name."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise RedisURLError(
            "a Redis URL starts with redis://, rediss://, unix://, redis+cluster://, "
            "rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
        )
    topology, ssl = _SCHEMES[scheme.lower()]
    if topology == "standalone":
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number 0..65535
        except ValueError:
            raise RedisURLError("not a valid Redis URL (bad host or port)") from None
        return RedisTarget("standalone", url, ssl=ssl)
    rest, _, query = rest.partition("?")  # a query may follow the hosts with no path: h:7000?x=1
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = _hosts(hosts)
    options = parse_qs(query)
    segments = [s for s in path.split("/") if s]
    service = None
    if topology == "sentinel":
        if not segments:
            raise RedisURLError("a Sentinel URL names its service: redis+sentinel://host:port/service_name[/db]")
        service = unquote(segments.pop(0))
    if len(segments) > 1 or (segments and not segments[0].isdigit()):
        raise RedisURLError("the database of a Redis URL is one number: .../0")
    db = int(segments[0]) if segments else 0
    if topology == "cluster" and db != 0:
        raise RedisURLError("Redis Cluster has only database 0")
    unknown = sorted(set(options) - {"sentinel_password"} if topology == "sentinel" else set(options))
    if unknown:  # redis-py's cluster and sentinel clients are built from parts, not from_url: say so
        raise RedisURLError(
            f"a {topology} URL takes no option {', '.join(unknown)!s:.80} (only sentinel_password, "
            "on a Sentinel URL); client timeouts are the service's own settings"
        )
    sentinel_password = options.get("sentinel_password", [None])[0]
    return RedisTarget(topology, url, nodes, service, db, ssl, username, password, sentinel_password)


def _checked(value: str) -> str:
    try:
        parse_redis_url(value)
    except RedisURLError as exc:
        raise ValueError(str(exc)) from None  # pydantic names the setting; never the URL
    return value


# A settings field holding a Redis URL of any topology above, checked at start-up.
RedisURL = Annotated[str, AfterValidator(_checked)]

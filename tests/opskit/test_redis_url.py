"""The one Redis URL -> client place (opskit/_redis_url.py, opskit/redis_client.py): topologies, credentials, errors that
never repeat a password, and the settings that use it."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from forecaster.settings import ForecasterSettings
from opskit import RedisURLError, parse_redis_url, redact_url
from opskit.redis_client import async_redis, check_redis_url, sync_redis
from router.settings import RouterSettings


def test_one_server_urls_stay_one_server() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380/2", "unix:///tmp/r.sock?db=3"):
        assert parse_redis_url(url).topology == "standalone"


def test_sentinel_url_names_sentinels_service_db_and_credentials() -> None:
    target = parse_redis_url(
        "redis+sentinel://app:s3cret@10.0.0.1:26379,10.0.0.2:26380/mymaster/4?sentinel_password=sentpw"
    )
    assert target.topology == "sentinel"
    assert target.nodes == (("10.0.0.1", 26379), ("10.0.0.2", 26380))
    assert (target.service, target.db, target.username, target.password) == ("mymaster", 4, "app", "s3cret")
    assert target.sentinel_password == "sentpw" and not target.ssl
    assert "s3cret" not in repr(target) and "sentpw" not in repr(target)
    assert "s3cret" not in target.shown and "sentpw" not in target.shown


def test_cluster_url_takes_several_startup_nodes_and_only_db_0() -> None:
    target = parse_redis_url("rediss+cluster://:pw@a:7000,b:7001")
    assert (target.topology, target.nodes, target.ssl, target.password) == (
        "cluster",
        (("a", 7000), ("b", 7001)),
        True,
        "pw",
    )
    with pytest.raises(RedisURLError, match="only database 0"):
        parse_redis_url("redis+cluster://a:7000/3")


@pytest.mark.parametrize(
    "url",
    [
        "memcached://h:1",
        "redis+sentinel://:pw@h:26379",
        "redis+sentinel://:pw@h/m",
        "redis+cluster://:pw@h:99999",
        "redis://:pw@h:notaport/0",
        "redis+sentinel://:pw@h:1/m/x",
    ],
)
def test_a_bad_url_is_an_error_that_does_not_repeat_the_password(url: str) -> None:
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url(url)
    assert "pw" not in str(caught.value)


def test_redact_hides_user_information_and_the_sentinel_password() -> None:
    assert (
        redact_url("redis+sentinel://u:pw@h:1,h:2/m/0?sentinel_password=x")
        == "redis+sentinel://***@h:1,h:2/m/0?sentinel_password=***"
    )
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_clients_are_redis_pys_own_classes_per_topology() -> None:
    assert type(sync_redis("redis://127.0.0.1:1/0")) is redis.Redis
    assert type(async_redis("redis://127.0.0.1:1/0")) is aioredis.Redis
    sentinel = async_redis("redis+sentinel://:pw@127.0.0.1:1/svc/2", socket_timeout=0.25)
    assert isinstance(sentinel.connection_pool, SentinelConnectionPool)
    assert sentinel.connection_pool.service_name == "svc"
    assert sentinel.connection_pool.connection_kwargs["db"] == 2
    assert sentinel.connection_pool.connection_kwargs["password"] == "pw"
    # the sentinels' own queries are bounded too (by the smaller of the two)
    assert sentinel.connection_pool.sentinel_manager.sentinels[0].get_connection_kwargs()["socket_timeout"] == 0.25


def test_a_cluster_nobody_answers_is_a_redis_error() -> None:
    # redis-py's asyncio cluster client connects on first use, the blocking one as it is made,
    # with its own RedisClusterException (no RedisError): the builder turns that into a
    # ConnectionError, which every caller already handles
    assert isinstance(async_redis("redis+cluster://127.0.0.1:1"), AsyncCluster)
    with pytest.raises(redis.ConnectionError):
        sync_redis("redis+cluster://127.0.0.1:1", socket_connect_timeout=0.2)


def test_the_forecasters_stores_turn_an_unreachable_cluster_into_their_own_errors() -> None:
    from forecaster.actuate.errors import PublishUnavailable
    from forecaster.actuate.publish import DesiredStore
    from forecaster.actuate.settings import ActuatorSettings
    from forecaster.errors import SourceUnavailable
    from forecaster.sources.redis_counters import RedisCounterSource
    from forecaster.state import RedisStateStore

    url = "redis+cluster://127.0.0.1:1"
    with pytest.raises(SourceUnavailable):
        RedisStateStore(url, "k", timeout_s=0.2).load()
    with pytest.raises(SourceUnavailable):
        RedisCounterSource(url, "m", 3600, timeout_s=0.2).fetch()
    store = DesiredStore.from_settings(ActuatorSettings(redis_url=url, deployment="d", request_timeout_s=0.2))
    with pytest.raises(PublishUnavailable):
        store.read()


def test_settings_accept_every_topology_and_refuse_a_bad_url_without_echoing_it(monkeypatch) -> None:
    url = "redis+sentinel://:hunter2@127.0.0.1:26379/promptedge/0"
    assert RouterSettings(redis_url=url).redis_url == url
    monkeypatch.setenv("PROMPTEDGE_REDIS_URL", url)
    assert ForecasterSettings().redis_url == url
    with pytest.raises(ValidationError) as caught:
        RouterSettings(redis_url="redis+sentinel://:hunter2@127.0.0.1:26379")
    # the message printed at start-up (router/__main__.py prints msg and location, not the input)
    assert "service" in caught.value.errors()[0]["msg"] and "hunter2" not in caught.value.errors()[0]["msg"]


def test_redact_hides_a_password_given_in_the_query() -> None:
    # redis-py's from_url reads ?password= (and ?username=) as the credential: the cache CLI's
    # "Redis at ... unavailable" printed it (attack review Dec 2 #2)
    assert (
        redact_url("redis://h:6379/0?password=hunter2&socket_timeout=1")
        == "redis://h:6379/0?password=***&socket_timeout=1"
    )
    assert "hunter2" not in redact_url("redis://h/0?db=1&Password=hunter2")
    assert "hunter2" not in redact_url("redis+sentinel://h:1/m?Sentinel_Password=hunter2")


@pytest.mark.parametrize(
    "url, option",
    [
        ("redis://:pw@127.0.0.1:6379/0?socket_timeout=abc", "socket_timeout"),
        ("redis://:pw@127.0.0.1:6379/0?health_check_interval=x", "health_check_interval"),
        # attack round 3 December: an unknown option passed every check and
        # the first connection raised TypeError (router exit 3, traceback)
        ("redis://u:pw@127.0.0.1:6379/9?foo=bar", "foo"),
        ("unix:///tmp/redis.sock?db=0&foo=1", "foo"),
    ],
)
def test_a_bad_option_of_a_one_server_url_is_a_url_error_before_any_client(url: str, option: str) -> None:
    # attack round F-minor: redis-py raised a bare ValueError from Redis.from_url when the client was
    # built, a start-up traceback instead of the settings error that names the setting
    for build in (check_redis_url, sync_redis, async_redis):
        with pytest.raises(RedisURLError) as caught:
            build(url)
        message = str(caught.value)
        assert "pw" not in message and option in message


@pytest.mark.parametrize(
    "url",
    [
        "redis+cluster://h:7000?socket_timeout=1",
        "redis+sentinel://:pw@h:26379/m/0?ssl_cert_reqs=none&sentinel_password=x",
    ],
)
def test_options_a_cluster_or_sentinel_url_cannot_carry_are_refused_not_ignored(url: str) -> None:
    # they were silently dropped: a user's socket_timeout had no effect and nothing said so
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url(url)
    assert "pw" not in str(caught.value) and "sentinel_password" in str(caught.value)


def test_one_server_url_options_redis_py_understands_still_parse() -> None:
    check_redis_url("redis://127.0.0.1:6379/0?socket_timeout=0.5&decode_responses=true")

"""Several POPs (issue 15 item 6): two real redis-server processes, one per POP, each holding
the counters its router writes; the forecaster sums them per minute, keeps a minute one POP did
not count as missing, and holds (never scales down) while one POP's Redis is dead or stalled."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from pydantic import ValidationError
from typer.testing import CliRunner

from forecaster import ForecasterSettings, PopsCounterSource, RedisCounterSource, RedisStateStore, run_once
from forecaster.cli import app
from forecaster.errors import ConfigError, SourceUnavailable
from sim.stack import RedisServer

BASE = 28_000_000  # a Unix minute
B_PASSWORD = "pw-pop-b-15"


@pytest.fixture()
def pops() -> Iterator[tuple[RedisServer, RedisServer]]:
    """POP a's and POP b's Redis: two separate redis-server processes (b with a password)."""
    with RedisServer() as a, RedisServer(password=B_PASSWORD) as b:
        yield a, b


def count(url: str, per_minute: dict[int, int], misses: bool = True, model: str = "m") -> None:
    """Counters as a router writes them (README.md, Redis layout)."""
    with redis.Redis.from_url(url) as client:
        pipe = client.pipeline(transaction=False)
        pipe.sadd("promptedge:traffic:models", model)
        for minute, n in per_minute.items():
            key = f"promptedge:traffic:{model}:{minute // 1440}"
            pipe.hincrby(key, f"{minute}:requests", n)
            if misses:
                pipe.hincrby(key, f"{minute}:misses", n // 2)
        pipe.execute()


def by_minute(source: PopsCounterSource | RedisCounterSource, now: float) -> dict[int, float]:
    traffic = source.fetch(now)
    return dict(zip((traffic.times() // 60).astype(int).tolist(), traffic.requests.tolist()))


def test_two_pops_are_summed_per_minute(pops: tuple[RedisServer, RedisServer]) -> None:
    a, b = pops
    count(a.url, {BASE + i: 60 for i in range(10)})
    count(b.url, {BASE + i: 120 for i in range(10)}, misses=False)  # b: every request a cache hit
    source = PopsCounterSource({"a": a.url, "b": b.url}, None, history_s=600)
    traffic = source.fetch((BASE + 10) * 60 + 5)
    assert traffic.start == BASE * 60 and len(traffic) == 10
    np.testing.assert_allclose(traffic.requests, 3.0)  # (60 + 120) / 60 s
    # b wrote no misses field: 0 misses there (the router counts every miss), not "no cache"
    assert traffic.misses is not None
    np.testing.assert_allclose(traffic.misses, 0.5)  # a's 30 a minute


def test_a_minute_one_pop_did_not_count_is_missing(pops: tuple[RedisServer, RedisServer]) -> None:
    a, b = pops
    count(a.url, {BASE + i: 60 for i in range(10)})
    count(b.url, {BASE + i: 120 for i in range(10) if i != 5})  # b's router was down in BASE+5
    now = (BASE + 10) * 60 + 5
    summed = by_minute(PopsCounterSource({"a": a.url, "b": b.url}, "m", history_s=600), now)
    assert by_minute(RedisCounterSource(a.url, "m", history_s=600), now)[BASE + 5] == 1.0
    assert np.isnan(summed[BASE + 5])  # not a's 1.0 alone: that would read b's outage as a drop
    assert summed[BASE + 4] == 3.0 and summed[BASE + 6] == 3.0


def plan_settings(state_url: str, pops: dict[str, str]) -> ForecasterSettings:
    return ForecasterSettings(
        redis_url=state_url,
        pops=pops,
        capacity_per_replica=0.5,
        headroom=0.0,
        upper_headroom=0.0,
        min_replicas=1,
        max_replicas=20,
        warmup_s=60,
        history_s=3 * 3600,
        models=["last_value"],
        up_cooldown_s=0,
        down_cooldown_s=0,
        source_timeout_s=1.0,
    )


def test_a_killed_pop_holds_the_decision_and_its_return_resumes(
    pops: tuple[RedisServer, RedisServer], redis_url: str
) -> None:
    a, b = pops
    minutes = range(BASE - 180, BASE)
    count(a.url, {m: 60 for m in minutes}, misses=False)  # no cache: the demand is the requests
    count(b.url, {m: 120 for m in minutes}, misses=False)
    settings = plan_settings(redis_url, {"a": a.url, "b": b.url})
    store = RedisStateStore(redis_url, "promptedge:forecaster:state:test/pops", timeout_s=1.0)
    source = PopsCounterSource(settings.pops, None, settings.history_s, settings.source_timeout_s)
    first = run_once(settings, source, now=BASE * 60 + 5, store=store)
    assert first.decision.action != "hold" and first.decision.replicas == 6  # 3 req/s at 0.5 each
    # what summing only the POPs that answer would decide: a third of the demand
    a_alone = run_once(settings, RedisCounterSource(a.url, None, settings.history_s), now=BASE * 60 + 5)
    assert a_alone.decision.replicas == 2

    b.kill()  # SIGKILL: b's Redis is gone without a goodbye
    count(a.url, {BASE: 60}, misses=False)
    held = run_once(settings, source, now=(BASE + 1) * 60 + 5, store=store)
    assert held.decision.action == "hold" and held.decision.replicas == 6
    assert "POP b" in held.decision.reason and "POP a" not in held.decision.reason
    assert B_PASSWORD not in held.decision.reason

    b.start()  # back on its port, empty (no persistence): its router marks minutes again
    count(a.url, {BASE + 1: 60, BASE + 2: 60}, misses=False)
    count(b.url, {BASE + 1: 120, BASE + 2: 120}, misses=False)
    resumed = run_once(settings, source, now=(BASE + 3) * 60 + 5, store=store)
    assert resumed.decision.action != "hold" and resumed.decision.replicas == 6
    # the 180 minutes read end at BASE+2; b's Redis lost all but its last 2: missing, never zero
    assert resumed.series["missing_buckets"] == 178


@pytest.mark.parametrize(
    ("counted", "reason"),
    [
        ({"paris"}, "redis:all models at POP nyc returned no data"),  # nyc's router never counted
        (set(), "redis:all models at POPs paris, nyc returned no data"),
    ],
)
def test_the_no_data_hold_names_only_the_pops_without_data(
    pops: tuple[RedisServer, RedisServer], redis_url: str, counted: set[str], reason: str
) -> None:
    # It named every configured POP ("at POPs paris, nyc returned no data") when only nyc had
    # nothing: the operator looked at paris for nothing.
    a, b = pops
    urls = {"paris": a.url, "nyc": b.url}
    for name in counted:
        count(urls[name], {m: 60 for m in range(BASE - 180, BASE)}, misses=False)
    settings = plan_settings(redis_url, urls)
    source = PopsCounterSource(settings.pops, None, settings.history_s, settings.source_timeout_s)
    held = run_once(settings, source, now=BASE * 60 + 5)
    assert held.decision.action == "hold"
    assert held.decision.reason.split("; ")[0] == f"hold: {reason}"  # then what it holds


@pytest.mark.parametrize("wrong_key", ["promptedge:traffic:models", f"promptedge:traffic:m:{(BASE - 1) // 1440}"])
def test_a_pop_whose_redis_refuses_the_read_is_a_named_hold(
    pops: tuple[RedisServer, RedisServer], redis_url: str, wrong_key: str
) -> None:
    # WRONGTYPE (the model set or a day's hash holds a string): a traceback before, not a hold
    a, b = pops
    minutes = range(BASE - 180, BASE)
    count(a.url, {m: 60 for m in minutes}, misses=False)
    count(b.url, {m: 120 for m in minutes}, misses=False)
    with redis.Redis.from_url(b.url) as client:
        client.delete(wrong_key)
        client.set(wrong_key, "not a counter")
    settings = plan_settings(redis_url, {"a": a.url, "b": b.url})
    source = PopsCounterSource(settings.pops, None, settings.history_s, settings.source_timeout_s)
    held = run_once(settings, source, now=BASE * 60 + 5)
    assert held.decision.action == "hold"
    assert "POP b: " in held.decision.reason and "ResponseError" in held.decision.reason
    assert "POP a" not in held.decision.reason and B_PASSWORD not in held.decision.reason


def test_a_pop_whose_acl_user_may_not_read_the_counters_is_a_named_hold(
    pops: tuple[RedisServer, RedisServer], redis_url: str
) -> None:
    # ACL NOPERM: the POP's Redis answers, but this user may not read the counter keys. A POP's
    # own redis-server: an ACL change on the shared test Redis would reach every other test.
    a, b = pops
    minutes = range(BASE - 180, BASE)
    count(a.url, {m: 60 for m in minutes}, misses=False)
    password = "pw-reader-i15"
    with redis.Redis.from_url(a.url) as admin:
        admin.acl_setuser("reader", enabled=True, passwords=[f"+{password}"], keys=["unrelated:*"], commands=["+@all"])
        try:
            reader_url = f"redis://reader:{password}@127.0.0.1:{a.port}/0"
            settings = plan_settings(redis_url, {"a": reader_url, "b": b.url})
            source = PopsCounterSource(settings.pops, None, settings.history_s, settings.source_timeout_s)
            held = run_once(settings, source, now=BASE * 60 + 5)
        finally:
            admin.acl_deluser("reader")
    assert held.decision.action == "hold"
    assert held.decision.reason.count("POP a: ") == 1 and "NoPermissionError" in held.decision.reason
    assert password not in held.decision.reason and "POP b" not in held.decision.reason


def test_a_stalled_pop_times_out_by_name(pops: tuple[RedisServer, RedisServer]) -> None:
    a, b = pops
    count(a.url, {BASE: 60})
    count(b.url, {BASE: 60})
    assert a.process is not None
    a.process.send_signal(signal.SIGSTOP)  # accepts connections (kernel backlog), never answers
    try:
        with pytest.raises(SourceUnavailable) as info:
            PopsCounterSource({"a": a.url, "b": b.url}, "m", 600, timeout_s=0.3).fetch((BASE + 1) * 60)
    finally:
        a.process.send_signal(signal.SIGCONT)
    assert str(info.value).startswith("POP a: ") and "POP b" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"paris": "redis://:hunter2@10.0.0.1:6379/0",', "PROMPTEDGE_FORECASTER_POPS: not JSON: "),  # not JSON
        (
            '["redis://:hunter2@10.0.0.1:6379/0"]',
            "PROMPTEDGE_FORECASTER_POPS: Input should be a valid dictionary",
        ),  # a list
        ('{"paris": "redis://:hunter2@10.0.0.1:port/0"}', "PROMPTEDGE_FORECASTER_POPS.paris: not a valid Redis URL"),
        ('{"paris": "http://:hunter2@10.0.0.1/0"}', "PROMPTEDGE_FORECASTER_POPS.paris: a Redis URL starts with"),
        ('{"pop paris": "redis://:hunter2@10.0.0.1:6379/0"}', "bad POP name 'pop paris'"),
        ('{"paris": "redis://:hunter2@10.0.0.1:6379/0?socket_timeout=abc"}', "PROMPTEDGE_FORECASTER_POPS: POP paris: "),
        # the same Redis twice counted its demand twice (attack round)
        (
            '{"paris": "redis://:hunter2@10.0.0.1:6379/0", "nyc": "redis://:hunter2@10.0.0.1:6379/0"}',
            "POPs paris and nyc name the same Redis URL",
        ),
        # an empty host read localhost (another POP's Redis, or the central one) in silence
        ('{"paris": "redis://:hunter2@:6379/0"}', "POP paris: the Redis URL has no host"),
        ('{"nyc": "redis://10.0.0.2:6379/0", "paris": "rediss://:6379/0"}', "POP paris: the Redis URL has no host"),
        # a name given twice kept only its last URL in silence (json.loads' last key wins)
        (
            '{"paris": "redis://:hunter2@10.0.0.1:6379/0", "paris": "redis://:hunter2@10.0.0.2:6379/0"}',
            "POP paris is named twice",
        ),
    ],
)
def test_malformed_pops_are_a_settings_error_without_the_password(value: str, expected: str) -> None:
    result = CliRunner().invoke(
        app, ["run", "--once"], env={"PROMPTEDGE_FORECASTER_POPS": value, "PROMPTEDGE_SETTINGS_FILE": None}
    )
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and expected in result.output
    assert "hunter2" not in result.output and "Traceback" not in result.output


def test_a_bad_redis_url_is_not_echoed_either() -> None:
    result = CliRunner().invoke(
        app,
        ["run", "--once"],
        env={"PROMPTEDGE_REDIS_URL": "redis://:hunter2@x:port/0", "PROMPTEDGE_SETTINGS_FILE": None},
    )
    assert result.exit_code == 2 and "PROMPTEDGE_REDIS_URL" in result.output
    assert "hunter2" not in result.output


def test_pops_from_the_settings_file_and_only_for_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(
        "forecaster:\n  redis_url: redis://central:6379/0\n  pops:\n"
        "    paris: redis://redis.paris:6379/0\n    nyc: redis+sentinel://s1:26379,s2:26379/pop/0\n"
    )
    monkeypatch.setenv("PROMPTEDGE_SETTINGS_FILE", str(path))
    settings = ForecasterSettings()
    assert settings.pops == {"paris": "redis://redis.paris:6379/0", "nyc": "redis+sentinel://s1:26379,s2:26379/pop/0"}
    assert settings.redis_url == "redis://central:6379/0"
    with pytest.raises(ValidationError, match="need source 'redis'"):
        ForecasterSettings(source="prometheus")


def test_a_pop_url_without_a_host_is_refused_by_the_source_too() -> None:
    with pytest.raises(ConfigError, match="POP paris: the Redis URL has no host"):
        PopsCounterSource({"nyc": "redis://10.0.0.2:6379/0", "paris": "redis://:6379/0"}, None, 600)

"""Credentials (issue 13, finding 7): the router's own key for replicas started with an API key,
the client's key never forwarded unless configured, replica lists that cannot carry a literal
key or an unknown field, and a Redis that requires a password, with no secret in any log."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from router import ReplicaSpec, RouterSettings
from sim.stack import RedisServer
from tests.router.conftest import CHAT, MODEL

REPLICAS_ONE = '[{"url": "http://127.0.0.1:8001", "model": "' + MODEL + '"}]'

TENANT_KEY = "sk-tenant-0123456789"
BACKEND_KEY = "sk-backend-abcdef"
NO_CACHE = {"cache-control": "no-cache"}


async def test_client_key_is_not_forwarded_to_a_replica(start_replica, start_router, client) -> None:
    # A real backend that accepts exactly the tenant's key: it answers 200 only if the router
    # forwarded the client's Authorization header.
    replica = await start_replica(api_key=TENANT_KEY)
    router = await start_router([replica.url])
    response = await client.post(
        f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {TENANT_KEY}", **NO_CACHE}
    )
    # The replica refused the router, not the client: a 502 saying so, not the replica's 401,
    # which would tell the client that its own (valid) key is wrong.
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "replica_auth_failed"
    assert TENANT_KEY not in response.text


async def test_a_wrong_backend_key_is_a_502_that_never_shows_the_key(
    start_replica, start_router, client, tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "vllm-key"
    key_file.write_text("sk-stale-rotated-key")
    replica = await start_replica(api_key=BACKEND_KEY)
    router = await start_router([replica.url], backend_keys={"*": {"file": str(key_file)}})
    response = await client.post(f"{router.url}/v1/chat/completions", json=CHAT, headers=NO_CACHE)
    assert response.status_code == 502 and response.json()["error"]["code"] == "replica_auth_failed"
    assert "sk-stale-rotated-key" not in response.text + caplog.text
    # a refused credential says nothing about the replica's health: it stays in the pool
    assert (await client.get(f"{router.url}/health")).json()["pools"][MODEL]["ready"] == 1


async def test_forward_client_key_setting_forwards_it(start_replica, start_router, client) -> None:
    replica = await start_replica(api_key=TENANT_KEY)
    router = await start_router([replica.url], forward_client_key=True)
    response = await client.post(
        f"{router.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {TENANT_KEY}", **NO_CACHE}
    )
    assert response.status_code == 200, response.text


async def test_backend_key_from_a_file_reaches_a_replica_started_with_api_key(
    start_replica, start_router, client, tmp_path: Path
) -> None:
    key_file = tmp_path / "vllm-key"
    key_file.write_text(BACKEND_KEY + "\n")  # a mounted Secret often ends with a newline
    replica = await start_replica(api_key=BACKEND_KEY)
    router = await start_router([replica.url], backend_keys={"*": {"file": str(key_file)}})
    for headers in ({}, {"authorization": f"Bearer {TENANT_KEY}"}):  # anonymous and a tenant
        response = await client.post(f"{router.url}/v1/chat/completions", json=CHAT, headers={**headers, **NO_CACHE})
        assert response.status_code == 200, response.text


async def test_per_replica_key_from_env_wins_over_the_pool_key(
    start_replica, start_router, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("H13_KEY_A", "sk-replica-a")
    monkeypatch.setenv("H13_KEY_POOL", "sk-pool")
    a = await start_replica(api_key="sk-replica-a")
    b = await start_replica(api_key="sk-pool")
    specs = [ReplicaSpec(url=a.url, model=MODEL, backend_key={"env": "H13_KEY_A"}), ReplicaSpec(url=b.url, model=MODEL)]
    router = await start_router(
        [], specs=specs, backend_keys={MODEL: {"env": "H13_KEY_POOL"}}, policy="round_robin", prefix_affinity=False
    )
    served = set()
    for _ in range(6):
        response = await client.post(f"{router.url}/v1/chat/completions", json=CHAT, headers=NO_CACHE)
        assert response.status_code == 200, response.text
        served.add(response.headers["x-promptedge-replica"])
    assert served == {a.url, b.url}


@pytest.mark.parametrize(
    "field",
    [{"helth_path": "/ready"}, {"api_key": "sk-literal-in-the-list"}, {"backend_key": "sk-literal-in-the-list"}],
)
def test_json_replica_setting_rejects_unknown_fields_and_literal_keys(
    monkeypatch: pytest.MonkeyPatch, field: dict[str, str]
) -> None:
    replica = {"url": "http://127.0.0.1:8001", "model": MODEL, **field}
    monkeypatch.setenv("PROMPTEDGE_ROUTER_REPLICAS", __import__("json").dumps([replica]))
    with pytest.raises(ValidationError) as info:
        RouterSettings()
    errors = info.value.errors(include_url=False)
    assert any(next(iter(field)) in map(str, e["loc"]) for e in errors), errors


def test_replica_url_with_credentials_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        ReplicaSpec(url="http://user:sk-in-url@127.0.0.1:8001", model=MODEL)
    assert "sk-in-url" not in "; ".join(e["msg"] for e in info.value.errors(include_url=False))


def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "router", "serve", "--port", "1"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_names_a_missing_key_file_and_never_prints_a_key(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-key"
    replicas = [{"url": "http://127.0.0.1:8001", "model": MODEL, "backend_key": {"file": str(missing)}}]
    proc = _serve({"PROMPTEDGE_ROUTER_REPLICAS": __import__("json").dumps(replicas)})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and str(missing) in proc.stderr
    literal = [{"url": "http://127.0.0.1:8001", "model": MODEL, "backend_key": "sk-literal-xyz"}]
    proc = _serve({"PROMPTEDGE_ROUTER_REPLICAS": __import__("json").dumps(literal)})
    assert proc.returncode == 2 and "backend_key" in proc.stderr
    assert "sk-literal-xyz" not in proc.stderr + proc.stdout


async def test_redis_with_a_password_caches_and_no_log_line_shows_it(
    start_replica, start_router, client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    password = "pw-h13-never-logged"
    with RedisServer(password=password) as server:
        replica = await start_replica()
        router = await start_router([replica.url], redis_url=f"redis://default:{password}@127.0.0.1:{server.port}/0")
        first = await client.post(f"{router.url}/v1/chat/completions", json=CHAT)
        assert first.status_code == 200, first.text
        for _ in range(100):  # stored after the answer is sent
            second = await client.post(f"{router.url}/v1/chat/completions", json=CHAT)
            if second.headers.get("x-cache") == "exact":
                break
        assert second.headers.get("x-cache") == "exact"
        assert (await client.get(f"{router.url}/health")).json()["redis"] is True
        wrong = await start_router([replica.url], redis_url=f"redis://:{password}-wrong@127.0.0.1:{server.port}/0")
        assert (await client.post(f"{wrong.url}/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.get(f"{wrong.url}/health")).json()["status"] == "degraded"
    assert password not in caplog.text


def test_yaml_replica_file_carries_backend_key_and_a_missing_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from router.discovery.file import load_replicas_file
    from router.forward.credentials import CredentialError, Credentials

    monkeypatch.delenv("H13_UNSET_KEY", raising=False)
    path = tmp_path / "replicas.yaml"
    path.write_text(
        f"replicas:\n  - url: http://127.0.0.1:8001\n    model: {MODEL}\n    backend_key: {{env: H13_UNSET_KEY}}\n"
    )
    specs = load_replicas_file(path)
    with pytest.raises(CredentialError, match="env H13_UNSET_KEY"):
        Credentials({}).check(specs)
    monkeypatch.setenv("H13_UNSET_KEY", "sk-yaml")
    Credentials({}).check(specs)
    assert Credentials({}).authorization(specs[0].url, MODEL, specs[0].backend_key) == "Bearer sk-yaml"


def test_secret_ref_needs_exactly_one_source_and_refuses_what_is_not_a_key(tmp_path: Path) -> None:
    from router.forward.credentials import MAX_KEY_BYTES, CredentialError, SecretRef

    for bad in ({}, {"file": "/a", "env": "B"}, {"value": "sk-x"}):
        with pytest.raises(ValidationError):
            SecretRef.model_validate(bad)
    cases = {
        "empty": "\n",
        "two tokens": "sk-a sk-b",
        "control char": "sk-\x07",
        "too large": "k" * (MAX_KEY_BYTES + 1),
    }
    for name, content in cases.items():
        path = tmp_path / name.replace(" ", "-")
        path.write_text(content)
        with pytest.raises(CredentialError) as info:
            SecretRef(file=path).read()
        assert str(path) in str(info.value) and (len(content.strip()) < 3 or content.strip() not in str(info.value))
    with pytest.raises(CredentialError, match="cannot read"):
        SecretRef(file=tmp_path / "missing").read()


@pytest.mark.parametrize(
    "env",
    [
        {"PROMPTEDGE_ROUTER_API_KEYS": '{"sk-zz-secret": 5}'},
        {"PROMPTEDGE_ROUTER_RATE_LIMITS": '{"sk-zz-secret": {"requests_per_s": -1}}'},
        {"PROMPTEDGE_ROUTER_RATE_LIMITS": '{"sk-zz-secret": "fast"}'},
    ],
    ids=["api_keys", "rate_limit_value", "rate_limit_type"],
)
def test_a_bad_setting_keyed_by_api_key_is_named_without_the_key(env: dict[str, str]) -> None:
    # Regression (issue 13, A11): the error's location was api_keys.sk-zz-secret.
    proc = _serve({"PROMPTEDGE_ROUTER_REPLICAS": REPLICAS_ONE, **env})
    assert proc.returncode == 2, proc.stderr
    setting = next(iter(env))
    assert setting in proc.stderr and "Traceback" not in proc.stderr
    assert "sk-zz" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "env, field",
    [
        ({"PROMPTEDGE_ROUTER_RATE_LIMITS": '{"*": {"rps": 1}}'}, "rps"),
        ({"PROMPTEDGE_ROUTER_TIMEOUTS": '{"P1": {"ttfb": 5}}'}, "ttfb"),
    ],
    ids=["rate_limits", "timeouts"],
)
def test_a_misspelled_field_in_rate_limits_or_timeouts_is_a_start_up_error(env: dict[str, str], field: str) -> None:
    # Regression (issue 13, A12): the unknown field was ignored (no rate limit; ttfb_s kept at 120).
    proc = _serve({"PROMPTEDGE_ROUTER_REPLICAS": REPLICAS_ONE, **env})
    assert proc.returncode == 2, proc.stderr
    assert next(iter(env)) in proc.stderr and field in proc.stderr and "Traceback" not in proc.stderr


def test_a_redis_url_with_a_bad_port_is_a_clean_start_up_error() -> None:
    # Regression (issue 13, M2): a ValueError traceback at start.
    proc = _serve(
        {
            "PROMPTEDGE_ROUTER_REPLICAS": REPLICAS_ONE,
            "PROMPTEDGE_REDIS_URL": "redis://:pw-m2-secret@127.0.0.1:notaport/0",
        }
    )
    assert proc.returncode == 2, proc.stderr
    assert "PROMPTEDGE_REDIS_URL" in proc.stderr and "Traceback" not in proc.stderr
    assert "pw-m2-secret" not in proc.stderr + proc.stdout

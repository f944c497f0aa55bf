"""The cache CLI names the Redis it could not use without printing its password (issue 13, finding 7)."""

from __future__ import annotations

import os
import subprocess
import sys

from cache.settings import redact_url
from sim.stack import RedisServer


def test_redact_url_hides_user_and_password_only() -> None:
    assert redact_url("redis://:pw@127.0.0.1:6379/0") == "redis://***@127.0.0.1:6379/0"
    assert redact_url("redis://user:pw@host:1/2?x=1") == "redis://***@host:1/2?x=1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_cache_cli_never_prints_the_redis_password() -> None:
    with RedisServer(password="pw-cli-h13") as server:
        url = f"redis://:pw-cli-h13-wrong@127.0.0.1:{server.port}/0"
        proc = subprocess.run(
            [sys.executable, "-m", "cache", "stats"],
            env={**os.environ, "PROMPTEDGE_REDIS_URL": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode != 0
    assert f"127.0.0.1:{server.port}" in proc.stderr
    assert "pw-cli-h13" not in proc.stderr + proc.stdout

"""A malformed list/dict setting (invalid JSON, or a value the setting forbids) is a clear error
with exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPLICA = {"PROMPTEDGE_ROUTER_REPLICAS": '[{"url": "http://127.0.0.1:9", "model": "m"}]'}


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["router", "serve"], {"PROMPTEDGE_ROUTER_REPLICAS": '[{"url": "http://127.0.0.1:8001", "model": "m"}'}),
        (["forecaster", "run", "--once"], {"PROMPTEDGE_FORECASTER_MODELS": '["x"'}),
        (["cache", "stats"], {"PROMPTEDGE_CACHE_MODEL_THRESHOLDS": '{"m": '}),
        # a key mapped to the anonymous tenant would share its entries with every client without a key
        (["router", "serve"], {"PROMPTEDGE_ROUTER_API_KEYS": '{"sk-1": "default"}', **REPLICA}),
        (["router", "serve"], {"PROMPTEDGE_ROUTER_API_KEYS": '{"sk-1": "key:0123456789abcdef"}', **REPLICA}),
    ],
)
def test_invalid_json_setting_exits_2_with_the_setting_named(argv: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", *argv], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    name = next(iter(env)).removeprefix("PROMPTEDGE_").split("_", 1)[1].lower()
    assert name in proc.stderr.lower()

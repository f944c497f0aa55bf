"""`python -m forecaster run --once` end to end: Redis counters written in the router's layout,
real trace files, short history, JSON shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import redis
from typer.testing import CliRunner

from forecaster import ForecasterSettings, RedisCounterSource, RedisStateStore, TraceSource, run_once
from forecaster.cli import app

ROOT = Path(__file__).resolve().parents[2]


def write_counters(url: str, model: str, per_minute: dict[int, int], misses: float = 1.0) -> None:
    """Counters exactly as the router writes them (README: Redis layout)."""
    client = redis.Redis.from_url(url)
    client.sadd("promptedge:traffic:models", model)
    for minute, count in per_minute.items():
        key = f"promptedge:traffic:{model}:{minute // 1440}"
        client.hincrby(key, f"{minute}:requests", count)
        client.hincrby(key, f"{minute}:misses", int(round(count * misses)))
        client.hincrby(key, f"{minute}:prompt_tokens", count * 300)
        client.hincrby(key, f"{minute}:completion_tokens", count * 100)


def settings(url: str, **kw: object) -> ForecasterSettings:
    return ForecasterSettings(
        redis_url=url, capacity_per_replica=1.0, headroom=0.0, **{"rate_window_s": 60.0, **kw}
    )  # demand as counted


def test_redis_counters_zero_only_where_counted_missing_where_nobody_counted(redis_url: str) -> None:
    base = 28_000_000  # a Unix minute
    # The router marks a quiet minute it was up for with requests=0 (router.observe.counters heartbeat);
    # base+3 has no field at all: the router was down.
    write_counters(redis_url, "m", {base: 60, base + 1: 0, base + 2: 120, base + 4: 60})
    traffic = RedisCounterSource(redis_url, "m", history_s=600).fetch(now=(base + 5) * 60 + 10)
    by_minute = dict(zip((traffic.times() // 60).astype(int), traffic.requests))
    assert by_minute[base] == 1.0 and by_minute[base + 1] == 0.0 and by_minute[base + 2] == 2.0
    assert np.isnan(by_minute[base - 1])  # before the first counted minute: unknown
    assert np.isnan(by_minute[base + 3])  # an outage inside the span: unknown, not quiet
    assert by_minute[base + 4] == 1.0
    assert base + 5 not in by_minute  # the current minute is still being counted


def test_misses_are_the_demand_when_counted(redis_url: str) -> None:
    base = 28_000_000
    write_counters(redis_url, "m", {base + i: 120 for i in range(30)}, misses=0.25)
    result = run_once(settings(redis_url), RedisCounterSource(redis_url, "m", 3600), now=(base + 30) * 60)
    # 120 req/min = 2 req/s of which a quarter missed the cache: 0.5 req/s reach the GPUs
    assert result.steps[0].forecast == 0.5
    assert result.decision.replicas == 1


def test_short_history_from_redis_falls_back_and_says_so(redis_url: str) -> None:
    base = 28_000_000
    write_counters(redis_url, "m", {base: 200, base + 1: 260, base + 2: 300})
    store = RedisStateStore(redis_url, "promptedge:forecaster:state:test")
    result = run_once(settings(redis_url), RedisCounterSource(redis_url, "m", 3600), (base + 3) * 60, store)
    assert result.model == "last_value"
    assert "short history" in result.decision.reason
    # 300/min = 5 req/s at capacity 1 is the floor; the rising history widens the band above it
    assert result.steps[5].forecast == 5.0 and result.steps[5].upper > 5.0
    assert result.decision.replicas == result.steps[5].replicas > 5
    assert store.load() is not None and store.load().replicas == result.decision.replicas


def test_cli_json_on_real_azure_trace(data_dir: Path, tmp_path: Path) -> None:
    trace = data_dir / "traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, ["run", "--once", "--trace", str(trace), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["model"] in {"last_value", "seasonal_naive", "ets_level", "holt_winters"}
    assert len(doc["plan"]) == 30
    for row in doc["plan"]:
        assert set(row) >= {"minute", "forecast", "upper", "replicas"}
        assert row["upper"] >= row["forecast"] >= 0
    assert doc["decision"]["replicas"] >= 1 and doc["decision"]["reason"]
    assert "forecast" in result.stdout and "decision:" in result.stdout


def test_cli_bad_row_names_file_line_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,many,109\n"
    )
    result = CliRunner().invoke(app, ["run", "--once", "--trace", str(bad)])
    assert result.exit_code == 2
    assert f"{bad}: line 3, column 'ContextTokens'" in result.stderr
    assert "Traceback" not in result.output


def test_module_entry_point_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "forecaster", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and all(cmd in proc.stdout for cmd in ("run", "daemon", "backtest"))


def test_mooncake_trace_plans(data_dir: Path) -> None:
    source = TraceSource(data_dir / "traces/mooncake/conversation_trace.jsonl")
    result = run_once(settings("redis://unused"), source)
    assert len(result.steps) == 30 and result.decision.action == "set"

"""``python -m sim serve`` stops as vLLM does on SIGTERM: stop admitting, finish, exit 0.

A real replica process, a real signal, a real request in flight."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import httpx

from sim.stack import free_port
from tests.sim.replica_process import start_replica as start_sim_replica

MODEL = "sim-llama-8b"


def start_replica(port: int) -> subprocess.Popen[bytes]:
    return start_sim_replica(port, "--profile", "a100")


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0() -> None:
    port = free_port()
    proc = start_replica(port)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            # a100: ~9 ms per decode step, so 400 tokens stream for several seconds
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 400, "stream": True}
            with client.stream("POST", "/v1/completions", json=body) as stream:
                lines = stream.iter_lines()
                first = next(line for line in lines if line)  # the request is running
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                with httpx.Client(base_url=base, timeout=5) as other:  # a new connection
                    health = other.get("/health")
                    refused = other.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
                rest = [line for line in lines if line]
            assert proc.poll() is None or health.status_code == 503  # still draining when asked
        events = [first, *rest]
        text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
        assert events[-1] == "data: [DONE]"
        assert len(text.split()) == 400  # the in-flight request finished whole
        assert health.status_code == 503 and health.json() == {"status": "draining"}
        assert refused.status_code == 503
        assert refused.json()["error"]["message"] == "replica is shutting down"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()

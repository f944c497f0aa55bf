"""How long a Pod of ``python -m sim node`` takes from creation to Ready, against the warm-up
it asked for, on the real API server, in one run.

    python bench/sim_node_ready.py [--time-scale 20] [--warmups 0,60,300] [--pods 2] [--spares 2]
        [--settle-s 10] [--json PATH]

Starts the kube-apiserver of ``../shared/tools/kube`` (``PROMPTEDGE_KUBE_TOOLS``; no controller
manager needed: the Pods are created already bound, ``spec.nodeName``), one ``sim node`` at the
given time scale, then ``--pods`` Pods per warm-up (annotation ``promptedge.io/sim-warmup-s``,
readiness probe every 5 simulated seconds). For each Pod: wall seconds from the create call to
the first ``Ready=True`` seen (polled every 0.1 s), in simulated seconds (x scale), and the
overhead beyond the requested warm-up (the baseline: a node adding nothing). The overhead is
process start-up + probe period + the node's sync interval + polling, as wall time multiplied by
the scale. Pods beyond the node's spares start a fresh ``sim serve`` (seconds of imports); run
with ``--spares 0`` for the baseline without spares. Machine load is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
TOOLS = Path(os.environ.get("PROMPTEDGE_KUBE_TOOLS", ROOT.parent / "shared" / "tools" / "kube"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pod_body(name: str, warmup_s: float) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"promptedge.io/sim-warmup-s": str(warmup_s)}},
        "spec": {
            "nodeName": "sim-gpu-0",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm/vllm-openai:v0.11.0",
                    "command": ["vllm", "serve"],
                    "args": ["sim-llama-8b", "--port", "8000"],
                    "ports": [{"containerPort": 8000, "name": "http"}],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": "http"},
                        "periodSeconds": 5,
                        "failureThreshold": 1,
                    },
                }
            ],
        },
    }


def measure(core: client.CoreV1Api, warmups: list[float], pods: int, timeout_s: float) -> list[dict]:
    created: dict[str, tuple[float, float]] = {}
    for w in warmups:
        for i in range(pods):
            name = f"w{int(w)}-{i}"
            core.create_namespaced_pod("default", pod_body(name, w))
            created[name] = (w, time.monotonic())
    ready: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(ready) < len(created) and time.monotonic() < deadline:
        for p in core.list_namespaced_pod("default").items:
            if p.metadata.name not in ready and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or []
            ):
                ready[p.metadata.name] = time.monotonic()
        time.sleep(0.1)
    return [
        {"pod": n, "warmup_s": w, "ready_wall_s": (ready[n] - t0) if n in ready else None}
        for n, (w, t0) in created.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--warmups", default="0,60,300")
    ap.add_argument("--pods", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--spares", type=int, default=2, help="the node's pre-started replica processes")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="wall seconds between the node's registration and the first Pod (spares finish importing)",
    )
    args = ap.parse_args()
    warmups = [float(w) for w in args.warmups.split(",")]
    if not (TOOLS / "start.sh").is_file():
        sys.exit(f"no kube tools at {TOOLS} (set PROMPTEDGE_KUBE_TOOLS)")
    run = Path(tempfile.mkdtemp(prefix="bench-sim-node-"))
    etcd = free_port()
    env = {**os.environ, "RUN": str(run), "API_PORT": str(free_port()), "ETCD_PORT": str(etcd)}
    start = subprocess.run([str(TOOLS / "start.sh")], env=env, capture_output=True, text=True, timeout=240)
    if start.returncode != 0:
        sys.exit(f"start.sh failed: {start.stderr[-2000:]}")
    kubeconfig = start.stdout.strip().splitlines()[-1]
    node = None
    try:
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        core = client.CoreV1Api(client.ApiClient(cfg))
        core.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
        node = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim",
                "node",
                "--kubeconfig",
                kubeconfig,
                "--ip-base",
                "127.0.231",
                "--time-scale",
                str(args.time_scale),
                "--spares",
                str(args.spares),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        while not [n for n in core.list_node().items if not n.spec.taints]:
            time.sleep(0.2)
        time.sleep(args.settle_s)
        rows = measure(core, warmups, args.pods, timeout_s=max(warmups) / args.time_scale + 120)
    finally:
        if node is not None:
            node.send_signal(signal.SIGTERM)
            node.wait(timeout=30)
        subprocess.run([str(TOOLS / "stop.sh"), "--wipe"], env=env, capture_output=True, timeout=60)
    scale = args.time_scale
    print(f"{args.spares} spares, {len(warmups) * args.pods} Pods created at once")
    print(f"time scale {scale:g}x, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'warm-up (sim s)':>16} {'ready p50 (sim s)':>18} {'overhead p50 (sim s)':>21} {'ready p50 (wall s)':>19}")
    summary = []
    for w in warmups:
        wall = [r["ready_wall_s"] for r in rows if r["warmup_s"] == w and r["ready_wall_s"] is not None]
        p50 = statistics.median(wall) if wall else float("nan")
        summary.append(
            {
                "spares": args.spares,
                "warmup_s": w,
                "ready_p50_sim_s": p50 * scale,
                "overhead_p50_sim_s": p50 * scale - w,
                "ready_p50_wall_s": p50,
                "pods_ready": len(wall),
                "pods": args.pods,
            }
        )
        print(f"{w:>16.0f} {p50 * scale:>18.1f} {p50 * scale - w:>21.1f} {p50:>19.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"time_scale": scale, "rows": rows, "summary": summary, "loadavg": os.getloadavg()}, indent=2)
        )


if __name__ == "__main__":
    main()

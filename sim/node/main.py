"""Running the stand-in node as a process: client setup, signals, cleanup."""

from __future__ import annotations

import atexit
import logging
import signal
import threading
from types import FrameType

from kubernetes import client, config

from opskit import configure as configure_logging
from sim.node.kubeapi import KubeApi
from sim.node.kubelet import SimNode
from sim.node.settings import NodeSettings


def core_api(settings: NodeSettings) -> client.CoreV1Api:
    """A CoreV1Api from the kubeconfig (``settings.kubeconfig``/``context``; None: the client's
    default lookup). Raises kubernetes.config.ConfigException when there is none."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=settings.kubeconfig, context=settings.context, client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def run_node(settings: NodeSettings, stop: threading.Event | None = None) -> None:
    """Run the node until SIGTERM/SIGINT (or ``stop`` is set); every replica it started is
    stopped on the way out, however the loop ends."""
    configure_logging(settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per readiness probe
    stop = stop or threading.Event()
    node = SimNode(KubeApi(core_api(settings)), settings)
    atexit.register(node.close)

    def on_signal(sig: int, frame: FrameType | None) -> None:
        logging.getLogger("sim.node").info("node %s: signal %d, stopping replicas", settings.name, sig)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        node.run(stop)
    finally:
        node.close()

"""Settings of the stand-in node (env prefix ``PROMPTEDGE_SIM_NODE_``; CLI flags override)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from opskit import FileSettings, LogFormat


class NodeSettings(FileSettings):
    """One stand-in node. ``kubeconfig``/``context``: how to reach the API server (None: the
    client's defaults, ``KUBECONFIG`` or ~/.kube/config); ``name``: the Node's name; ``gpus``:
    its ``nvidia.com/gpu`` capacity; ``ip_base``: three loopback octets, Pods get
    ``<ip_base>.2..254``; ``time_scale``: simulated seconds per wall second (replica step
    times, warm-up, probe periods, back-off and grace periods); ``profile``/``warmup``: the
    defaults when a Pod's annotations name none (warm-up in seconds or a distribution name);
    ``log_dir``: where replica logs go (None: a temporary folder removed at exit); ``spares``:
    replica processes kept started with their imports done, so a Pod's replica starts in
    milliseconds instead of seconds of wall time that the time scale would multiply (0: none);
    ``log_format``: the node's stderr lines as JSON objects (json) or text."""

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_SIM_NODE_")

    kubeconfig: str | None = None
    context: str | None = None
    name: str = "sim-gpu-0"
    gpus: int = Field(default=8, ge=0)
    ip_base: str = "127.0.1"
    time_scale: float = Field(default=1.0, gt=0)
    profile: str = "a100"
    warmup: str = "0"
    cpu: str = "64"
    memory: str = "512Gi"
    max_pods: int = Field(default=110, ge=1)
    log_dir: Path | None = None
    spares: int = Field(default=2, ge=0, le=16)
    sync_interval_s: float = Field(default=0.2, gt=0, le=5)  # wall seconds between Pod lists
    log_format: LogFormat = "json"

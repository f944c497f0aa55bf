"""Settings of the stand-in node (env prefix ``PROMPTEDGE_SIM_NODE_``; CLI flags override)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class NodeSettings(BaseSettings):
    """One stand-in node. ``kubeconfig``/``context``: how to reach the API server (None: the
    client's defaults, ``KUBECONFIG`` or ~/.kube/config); ``name``: the Node's name; ``gpus``:
    its ``nvidia.com/gpu`` capacity; ``ip_base``: three loopback octets, Pods get
    ``<ip_base>.2..254``; ``time_scale``: simulated seconds per wall second (replica step
    times, warm-up, probe periods, back-off and grace periods); ``profile``/``warmup``: the
    defaults when a Pod's annotations name none (warm-up in seconds or a distribution name);
    ``log_dir``: where replica logs go (None: a temporary folder removed at exit)."""

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
    sync_interval_s: float = Field(default=0.2, gt=0, le=5)  # wall seconds between Pod lists

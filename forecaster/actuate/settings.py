"""Actuator settings (pydantic-settings, env prefix ``PROMPTEDGE_ACTUATOR_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict

from forecaster.actuate.errors import ActuationConfigError
from opskit import FileSettings, RedisURL

Mode = Literal["advisory", "dry-run", "kubernetes", "keda"]


class ActuatorSettings(FileSettings):
    """Where and how decisions are carried out.

    mode: ``advisory`` (the default: never writes the scale; each cycle records the decision,
    the Deployment's Ready and ``spec.replicas`` and the demand for ``python -m forecaster
    report``), ``dry-run`` (log only; reads the scale when a deployment is set), ``kubernetes``
    (patch the Deployment's scale subresource) or ``keda`` (publish desired replicas for KEDA's
    metrics-api scaler / an HPA external metric; never writes the scale).
    Kubernetes access: ``kubeconfig`` (+ ``context``) when set, else in-cluster when
    ``KUBERNETES_SERVICE_HOST`` is set, else ``$KUBECONFIG`` / ``~/.kube/config``.
    Times are seconds.
    """

    model_config = SettingsConfigDict(env_prefix="PROMPTEDGE_ACTUATOR_", extra="ignore", populate_by_name=True)

    # A new install watches before it acts: advisory writes nothing to the cluster (as dry-run)
    # and keeps the evidence (decisions against Ready replicas and demand) that the what-if
    # report turns into "what it would have done"; switching to kubernetes or keda is then a
    # decision made on that evidence, not on faith.
    mode: Mode = "advisory"
    namespace: str = "default"
    deployment: str | None = None
    kubeconfig: Path | None = None
    context: str | None = None
    request_timeout_s: float = Field(10.0, gt=0)
    conflict_attempts: int = Field(5, ge=1, le=20)
    conflict_backoff_s: float = Field(0.1, ge=0)
    annotate: bool = Field(True, description="write decision annotations (needs RBAC patch on deployments)")
    annotation_prefix: str = "promptedge.io"
    warmup_s: float = Field(300.0, gt=0, description="lead time used when no Ready pod can be measured")
    warmup_quantile: float = Field(0.9, gt=0, le=1)
    redis_url: RedisURL = Field(  # one server, Redis Cluster or Sentinel (opskit/_redis_url.py)
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("PROMPTEDGE_ACTUATOR_REDIS_URL", "PROMPTEDGE_REDIS_URL"),
    )
    publish_host: str = "127.0.0.1"
    publish_port: int = Field(8090, ge=1, le=65535)
    stale_after_s: float = Field(900.0, gt=0)
    # How long advisory observations are kept (Redis sorted set per target; trimmed on write).
    advisory_retention_s: float = Field(14 * 86400.0, gt=0)

    @model_validator(mode="after")
    def _deployment_needed(self) -> ActuatorSettings:
        if self.mode in ("kubernetes", "keda") and not self.deployment:
            raise ValueError(f"PROMPTEDGE_ACTUATOR_DEPLOYMENT is required when PROMPTEDGE_ACTUATOR_MODE={self.mode}")
        return self

    @property
    def target(self) -> str:
        """``namespace/deployment``, or ``namespace/-`` when no deployment is configured."""
        return f"{self.namespace}/{self.deployment or '-'}"


def load_actuator_settings(**overrides: object) -> ActuatorSettings:
    """Read settings from the environment (``overrides`` win); raises ActuationConfigError naming the variable."""
    try:
        return ActuatorSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(_describe(err["loc"], err["msg"]) for err in exc.errors())
        raise ActuationConfigError(f"invalid actuator settings: {problems}") from None


def _describe(loc: tuple[object, ...], msg: str) -> str:
    if not loc:  # a cross-field rule: its message names the variables itself
        return msg.removeprefix("Value error, ")
    return f"PROMPTEDGE_ACTUATOR_{'_'.join(str(part) for part in loc).upper()}: {msg}"

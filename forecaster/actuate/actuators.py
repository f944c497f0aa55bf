"""Carry a decision out: dry-run, the Deployment's scale subresource, or a published value for KEDA/HPA.

Reconcile shape (as in sample-controller and kopf): read the observed scale, compare with the
desired replicas, write only on a difference, guarded by resourceVersion; a 409 re-reads and
retries (bounded, tenacity). A run with nothing to do writes nothing, annotations included.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from kubernetes import client as k8s
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter

from forecaster.actuate.errors import ActuationError, KubeConflict
from forecaster.actuate.kube import KubeScaleAPI, new_api_client
from forecaster.actuate.publish import DesiredStore
from forecaster.actuate.reconcile import (
    DecisionLike,
    Scale,
    annotation_patch,
    decision_annotations,
    desired_replicas,
    hold_floor,
    is_hold,
    needs_scale,
    scale_patch,
)
from forecaster.actuate.settings import ActuatorSettings, Mode, load_actuator_settings

log = logging.getLogger(__name__)

Action = Literal["none", "scaled", "would-scale", "published", "advised"]


@dataclass(frozen=True)
class ActuationResult:
    """What one ``apply`` did.

    desired: replicas decided; observed: replicas the cluster had before (``spec.replicas`` of
    the scale subresource; the caller's ``current`` when the cluster was not read; None if
    unknown); action: ``none`` (already there, nothing written), ``scaled``, ``would-scale``
    (dry-run) or ``published`` (keda); attempts: reconcile attempts (>1 after 409 conflicts);
    annotated: decision annotations written on the Deployment; ready: the Deployment's Ready
    replicas (advisory mode; None when not read or unreadable); note: why ``ready`` is unknown.
    """

    mode: Mode
    target: str
    desired: int
    observed: int | None
    action: Action
    reason: str
    attempts: int = 1
    annotated: bool = False
    ready: int | None = None
    note: str = ""

    def summary(self) -> str:
        """One log/CLI line, e.g. ``kubernetes llm/vllm: scaled 2 -> 5 (attempts 2, annotated); reason: ...``."""
        before = "?" if self.observed is None else str(self.observed)
        what = {
            "none": f"unchanged at {self.desired}",
            "scaled": f"scaled {before} -> {self.desired}",
            "would-scale": f"would scale {before} -> {self.desired}",
            "published": f"published desired {self.desired} (observed {before})",
            "advised": f"advised {self.desired}, not scaling (spec {before}, Ready "
            f"{'?' if self.ready is None else self.ready}{f': {self.note}' if self.note else ''})",
        }[self.action]
        extra = (
            f" (attempts {self.attempts}{', annotated' if self.annotated else ''})" if self.action == "scaled" else ""
        )
        return f"{self.mode} {self.target}: {what}{extra}; reason: {self.reason}"


class Actuator(ABC):
    """Carries out decisions for one Deployment (``settings.namespace``/``settings.deployment``).

    The Kubernetes client is created on first use, so modes that need no cluster never load a
    kubeconfig. Errors: ``forecaster.actuate.errors`` (ActuationError subclasses).
    """

    mode: Mode

    def __init__(self, settings: ActuatorSettings, api_client: k8s.ApiClient | None = None) -> None:
        self._settings = settings
        self._api_client = api_client
        self._scale_api: KubeScaleAPI | None = None

    def _kube(self) -> KubeScaleAPI:
        if self._scale_api is None:
            assert self._settings.deployment, "callers check settings.deployment first"
            self._scale_api = KubeScaleAPI(
                self._api_client or new_api_client(self._settings),
                self._settings.namespace,
                self._settings.deployment,
                self._settings.request_timeout_s,
            )
        return self._scale_api

    def read_current(self) -> int | None:
        """Observed replicas (scale subresource ``spec.replicas``), or None when no deployment is configured."""
        if not self._settings.deployment:
            return None
        return self._kube().read_scale().replicas

    @abstractmethod
    def apply(self, decision: DecisionLike, current: int | None) -> ActuationResult:
        """Carry out ``decision`` (``replicas`` >= 0, ``reason``); ``current`` is the caller's observed replicas or None.

        Fail-safe: a decision with ``action == "hold"`` (inputs missing) never lowers the
        observed count; it can only keep or raise it.
        """

    def _result(
        self,
        desired: int,
        observed: int | None,
        action: Action,
        reason: str,
        attempts: int = 1,
        annotated: bool = False,
    ) -> ActuationResult:
        result = ActuationResult(
            self.mode, self._settings.target, desired, observed, action, reason, attempts, annotated
        )
        log.info("%s", result.summary())
        return result


class DryRunActuator(Actuator):
    """Writes nothing. Compares with the cluster's scale when a deployment is configured, else with ``current``."""

    mode: Mode = "dry-run"

    def apply(self, decision: DecisionLike, current: int | None) -> ActuationResult:
        observed = self.read_current() if self._settings.deployment else current
        desired = hold_floor(desired_replicas(decision), observed, is_hold(decision))
        action: Action = "none" if observed == desired else "would-scale"
        return self._result(desired, observed, action, decision.reason)


class AdvisoryActuator(Actuator):
    """Never writes: reads the Deployment's ``spec.replicas`` and Ready replicas (RBAC: ``get``
    on ``deployments``) so that the cycle can record them next to the decision. An unreadable
    Deployment (missing, forbidden, API server down) is no error here: the result says it is
    unknown and why (``note``), and advising goes on."""

    mode: Mode = "advisory"

    def read_current(self) -> int | None:
        """Observed ``spec.replicas`` (None without a deployment); raises ActuationError when unreadable."""
        if not self._settings.deployment:
            return None
        return self._kube().read_replicas()[0]

    def apply(self, decision: DecisionLike, current: int | None) -> ActuationResult:
        desired = hold_floor(desired_replicas(decision), current, is_hold(decision))
        if not self._settings.deployment:
            return self._advised(desired, current, None, decision.reason, "no deployment configured")
        try:
            spec, ready = self._kube().read_replicas()
        except ActuationError as exc:
            return self._advised(desired, current, None, decision.reason, str(exc))
        return self._advised(desired, spec, ready, decision.reason, "")

    def _advised(self, desired: int, spec: int | None, ready: int | None, reason: str, note: str) -> ActuationResult:
        result = ActuationResult(
            self.mode, self._settings.target, desired, spec, "advised", reason, ready=ready, note=note
        )
        log.info("%s", result.summary())
        return result


class KubernetesActuator(Actuator):
    """Patches the Deployment's scale subresource and annotates the Deployment with the decision.

    RBAC: ``get``, ``patch`` on ``deployments/scale``, plus ``patch`` on ``deployments`` for the
    annotations unless ``settings.annotate`` is off.
    """

    mode: Mode = "kubernetes"

    def _retrying(self) -> Retrying:
        return Retrying(
            retry=retry_if_exception_type(KubeConflict),
            stop=stop_after_attempt(self._settings.conflict_attempts),
            wait=wait_exponential_jitter(
                multiplier=self._settings.conflict_backoff_s, max=2.0, jitter=self._settings.conflict_backoff_s
            ),
            before_sleep=lambda state: log.warning("409 conflict, re-reading: %s", state.outcome.exception()),
            reraise=True,
        )

    def apply(self, decision: DecisionLike, current: int | None) -> ActuationResult:
        decided, holding = desired_replicas(decision), is_hold(decision)
        api = self._kube()
        observed, written, attempts, desired = None, None, 0, decided
        for attempt in self._retrying():
            with attempt:
                attempts += 1
                observed = api.read_scale()
                desired = hold_floor(decided, observed.replicas, holding)
                written = api.patch_scale(scale_patch(observed, desired)) if needs_scale(observed, desired) else None
        assert observed is not None
        if desired != decided:
            log.warning(
                "%s: hold on missing data, not scaling down from %d to %d",
                self._settings.target,
                observed.replicas,
                decided,
            )
        if current is not None and current != observed.replicas:
            log.info("%s: scale moved from %d to %d since planning", self._settings.target, current, observed.replicas)
        if written is None:
            return self._result(desired, observed.replicas, "none", decision.reason)
        annotated = self._settings.annotate and self._annotate(api, desired, decision.reason, written)
        return self._result(
            desired, observed.replicas, "scaled", decision.reason, attempts=attempts, annotated=annotated
        )

    def _annotate(self, api: KubeScaleAPI, desired: int, reason: str, written: Scale) -> bool:
        """Annotate at the version our scale write produced; after a 409, only if the scale still says ``desired``."""
        annotations = decision_annotations(self._settings.annotation_prefix, desired, reason, datetime.now(UTC))
        version: str | None = written.resource_version
        for attempt in self._retrying():
            with attempt:
                if version is None:
                    fresh = api.read_scale()
                    if fresh.replicas != desired:
                        log.warning(
                            "%s: scale changed to %d by another writer; decision not annotated",
                            self._settings.target,
                            fresh.replicas,
                        )
                        return False
                    version = fresh.resource_version
                try:
                    api.patch_deployment(annotation_patch(version, annotations))
                except KubeConflict:
                    version = None
                    raise
        return True


class KedaActuator(Actuator):
    """Publishes desired replicas (Redis, served by ``publish.create_app``) for KEDA's metrics-api scaler or an HPA.

    Never writes the scale: the HPA that KEDA manages stays the only writer, and takes the max of
    this value and its reactive triggers.
    """

    mode: Mode = "keda"

    def __init__(
        self, settings: ActuatorSettings, api_client: k8s.ApiClient | None = None, store: DesiredStore | None = None
    ) -> None:
        super().__init__(settings, api_client)
        self._store = store or DesiredStore.from_settings(settings)

    def apply(self, decision: DecisionLike, current: int | None) -> ActuationResult:
        desired = hold_floor(desired_replicas(decision), current, is_hold(decision))
        self._store.publish(desired, decision.reason, datetime.now(UTC))
        return self._result(desired, current, "published", decision.reason)


def build_actuator(
    settings: ActuatorSettings | None = None,
    api_client: k8s.ApiClient | None = None,
    store: DesiredStore | None = None,
) -> Actuator:
    """The actuator for ``settings.mode`` (default: settings from the environment).

    ``api_client`` / ``store`` are injection points for tests; by default they are built from
    the settings on first use. Raises ActuationConfigError for unusable settings (via
    ``load_actuator_settings``) or a missing kubeconfig (on first cluster call).
    """
    settings = settings or load_actuator_settings()
    if settings.mode == "kubernetes":
        return KubernetesActuator(settings, api_client)
    if settings.mode == "keda":
        return KedaActuator(settings, api_client, store)
    if settings.mode == "advisory":
        return AdvisoryActuator(settings, api_client)
    return DryRunActuator(settings, api_client)

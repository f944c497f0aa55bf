"""Actuation: carry planner decisions out on Kubernetes, or publish them for KEDA / an HPA.

Public surface::

    actuator = build_actuator()                     # settings from PROMPTEDGE_ACTUATOR_* env
    current = actuator.read_current()               # observed replicas or None
    result = actuator.apply(decision, current)      # decision: .replicas, .reason
    warmup = measure_warmup(settings)               # lead time for the planner, seconds

See forecaster/README-actuation.md for modes, RBAC, KEDA and exit codes.
"""

from forecaster.actuate.actuators import (
    ActuationResult,
    Actuator,
    AdvisoryActuator,
    DryRunActuator,
    KedaActuator,
    KubernetesActuator,
    build_actuator,
)
from forecaster.actuate.errors import (
    ActuationConfigError,
    ActuationError,
    InvalidDecision,
    KubeApiError,
    KubeConflict,
    KubeForbidden,
    KubeNotFound,
    KubeResource,
    KubeUnavailable,
    PublishUnavailable,
)
from forecaster.actuate.publish import DesiredStore, Published, create_app, serve_desired
from forecaster.actuate.reconcile import DecisionLike
from forecaster.actuate.settings import ActuatorSettings, load_actuator_settings
from forecaster.actuate.warmup import Warmup, measure_warmup

__all__ = [
    "ActuationConfigError",
    "ActuationError",
    "ActuationResult",
    "Actuator",
    "AdvisoryActuator",
    "ActuatorSettings",
    "DecisionLike",
    "DesiredStore",
    "DryRunActuator",
    "InvalidDecision",
    "KedaActuator",
    "KubeApiError",
    "KubeConflict",
    "KubeForbidden",
    "KubeNotFound",
    "KubeResource",
    "KubeUnavailable",
    "KubernetesActuator",
    "Published",
    "PublishUnavailable",
    "Warmup",
    "build_actuator",
    "create_app",
    "load_actuator_settings",
    "measure_warmup",
    "serve_desired",
]

"""The static replica list as a YAML file (``PROMPTEDGE_ROUTER_REPLICAS_FILE``).

Format (the same fields as ``PROMPTEDGE_ROUTER_REPLICAS``; unknown keys are errors, so a typo
cannot silently drop a setting)::

    replicas:
      - url: http://10.0.0.5:8000
        model: llama-3.1-8b
        profile: a100                                 # optional, a label for logs
        gpu_metrics_url: http://10.0.0.5:9400/metrics # optional, DCGM exporter
        backend_key: {file: /run/secrets/vllm-key}    # optional, the router's key (router/forward/credentials.py)

Errors name the file, the line and the field (``replicas.1.url``), from YAML node marks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from router.discovery.base import DiscoveryError
from router.settings import ReplicaSpec


class ReplicasFileError(DiscoveryError):
    """The replica file is unreadable or invalid; ``str()`` is ``FILE:LINE: field: message``."""

    def __init__(self, path: Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class _FileReplica(ReplicaSpec):
    model_config = ConfigDict(extra="forbid")


class _ReplicasFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    replicas: list[_FileReplica]


def load_replicas_file(path: Path) -> list[ReplicaSpec]:
    """The replicas listed in the YAML file at ``path``, in file order.

    Raises ReplicasFileError (file, 1-based line, dotted field) when the file cannot be read,
    is not YAML, has no ``replicas`` list, or an entry is invalid; an empty list is an error too.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReplicasFileError(path, None, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ReplicasFileError(
            path, None if mark is None else mark.line + 1, None, f"not valid YAML: {problem}"
        ) from None
    if not isinstance(data, dict):
        line = None if root is None else root.start_mark.line + 1
        raise ReplicasFileError(path, line, None, "expected a mapping with a `replicas` list")
    try:
        parsed = _ReplicasFile.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        loc = tuple(error["loc"])
        raise ReplicasFileError(path, _line_of(root, loc), ".".join(map(str, loc)) or None, error["msg"]) from None
    if not parsed.replicas:
        raise ReplicasFileError(path, _line_of(root, ("replicas",)), "replicas", "the list is empty")
    return [ReplicaSpec.model_validate(r.model_dump()) for r in parsed.replicas]


def _line_of(node: yaml.Node, loc: tuple[Any, ...]) -> int:
    """1-based line of the deepest node on ``loc`` that exists (a missing key: its mapping)."""
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
    return node.start_mark.line + 1


def _child(node: yaml.Node, part: Any) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        return next((value for key, value in node.value if key.value == part), None)
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return node.value[part]
    return None

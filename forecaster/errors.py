"""The forecaster's one error tree.

    ForecasterError
    ├── TraceFormatError         a trace file row that cannot be read
    ├── SourceUnavailable        a metrics source or Redis did not answer (the run holds)
    ├── ConfigError              settings or flags that contradict each other or the data
    └── ActuationError           the decision was not carried out (forecaster/actuate/errors.py)
        ├── ActuationConfigError
        ├── InvalidDecision
        ├── PublishUnavailable   the KEDA endpoint's Redis store
        └── KubeApiError         KubeForbidden, KubeNotFound, KubeConflict, KubeUnavailable

Everything the forecaster raises on bad input or an unavailable dependency derives from
``ForecasterError``; the CLI turns these into a one-line message and an exit code, never a
stack trace. Third-party errors are translated at one adapter each: redis-py's in
forecaster/sources/redis_errors.py (the counters source, forecaster/sources/redis_counters.py, still
tells unreachable from refused itself), Kubernetes' in forecaster/actuate/kube.py, httpx's
and trace parsing where each source reads.
"""

from __future__ import annotations

from pathlib import Path


class ForecasterError(Exception):
    """Base class of every error the forecaster reports to a user."""


class TraceFormatError(ForecasterError):
    """A trace file row that cannot be read.

    ``path``: the file; ``line``: 1-based line number in the file (header = line 1 when the
    format has one); ``column``: the column (field) name or position that is wrong.
    """

    def __init__(self, path: Path | str, line: int, column: str, message: str) -> None:
        self.path = Path(path)
        self.line = line
        self.column = column
        super().__init__(f"{self.path}: line {line}, column {column!r}: {message}")


class SourceUnavailable(ForecasterError):
    """A metrics source could not be reached or answered badly within its time bound.

    The runner holds the last decision when it sees this (fail-safe), it never scales down.
    """


class ConfigError(ForecasterError):
    """Settings or flags that contradict each other or the data (e.g. tokens asked, none counted)."""

"""Reading the cache's shipped model files (the learned verifier, the error-bound prior): JSON
read with a clear error naming the file, and kept once per file version per process."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def read_json(path: Path, what: str, error: type[Exception]) -> Any:
    """``json.load`` of ``path``; raises ``error("cannot read the <what> <path>: <reason>")`` when
    it is missing, unreadable or not JSON."""
    try:
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"cannot read the {what} {path}: {exc}") from None


class PerVersion(Generic[T]):
    """``load(path)`` once per file version (resolved path, size, modification time): a file
    replaced in place is read again, an unchanged one costs a ``stat``. ``what`` and ``error``
    name the file kind and the exception raised when it cannot be stat'ed."""

    def __init__(self, load: Callable[[Path], T], what: str, error: type[Exception]) -> None:
        self._load, self._what, self._error = load, what, error
        self._loaded: dict[tuple[str, int, int], T] = {}

    def get(self, path: Path) -> T:
        path = path.resolve()
        try:
            stat = path.stat()
        except OSError as exc:
            raise self._error(f"cannot read the {self._what} {path}: {exc}") from None
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self._loaded:
            self._loaded[key] = self._load(path)
        return self._loaded[key]

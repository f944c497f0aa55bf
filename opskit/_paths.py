"""Output files a command writes at its end, checked at its start."""

from __future__ import annotations

import os
from pathlib import Path


def output_path_error(option: str, path: Path | None) -> str | None:
    """Why ``path`` (given as ``option``, e.g. ``--json``) could not be written, or None when it
    can (or is None: nothing asked). Its folder is made now, as the writer would, and must be
    writable; the path must not be a folder. Meant before long work, so a bad path is a one-line
    error naming the option instead of a traceback after the work is done."""
    if path is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{option} {path}: cannot make its folder ({exc.strerror or exc})"
    if path.is_dir():
        return f"{option} {path}: is a folder, give a file name"
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return f"{option} {path}: not writable"
    return None

"""build_llama.py's cache bookkeeping, without building: flags name the folders, a stale failure
does not outlive a new attempt, and the smoke start tells a dead server from a working one."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tools import build_llama
from tests.tools.build_llama import CMAKE_FLAGS, LLAMA_CPP_PYTHON, BuildError, LlamaFiles, build_key


def test_other_flags_or_version_build_into_other_folders() -> None:
    key = build_key()
    assert key.startswith(f"{LLAMA_CPP_PYTHON}-")
    assert build_key(flags=(*CMAKE_FLAGS[:-1], "-DGGML_NATIVE=ON")) != key
    assert build_key(version="0.0.1") != key
    assert build_key() == key  # stable: a rerun finds its own build
    assert LlamaFiles(Path("/c")).server == Path(f"/c/bin-{key}/llama-server")


def test_a_new_attempt_clears_the_last_failure_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = LlamaFiles(tmp_path)
    files.failure.write_text("llama-server built but exited -11 loading the model\n")
    seen: list[bool] = []
    monkeypatch.setattr(build_llama, "_fetch_model", lambda *args: None)

    def failing_build(*args: object) -> None:
        seen.append(files.failure.exists())
        raise BuildError("step `cmake build llama-server` exited 1")

    monkeypatch.setattr(build_llama, "_build_server", failing_build)
    with pytest.raises(BuildError):
        build_llama.build(files, jobs=1, timeout_s=60)
    assert seen == [False]  # the old reason was gone while the new build ran
    assert files.failure.read_text() == "step `cmake build llama-server` exited 1\n"


def test_a_server_that_dies_is_a_problem() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    proc.wait()
    problem = build_llama._smoke_problem(proc, "http://127.0.0.1:9", time.monotonic() + 60)
    assert problem == "exited -15 loading the model"  # SIGTERM: no core file, unlike a real SIGSEGV


def test_a_server_that_never_answers_is_a_problem() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        problem = build_llama._smoke_problem(proc, "http://127.0.0.1:9", time.monotonic())  # port 9: nothing
    finally:
        proc.kill()
        proc.wait()
    assert problem is not None and problem.startswith("did not answer /health 200")

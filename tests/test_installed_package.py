"""The package as the images install it, not the source tree: a wheel built from exactly what
each Dockerfile copies (``pip wheel --no-deps``, no build isolation: no index is needed),
installed with ``--no-deps`` into a fresh virtualenv, where each console script answers
``--help`` for the commands the manifests run, the modules come from that virtualenv, and the
data files the code reads at run time are inside the wheel.

The fresh virtualenv borrows the third-party dependencies of the running one (a ``.pth`` line
naming its site-packages, which adds the directory without running that directory's own
``.pth`` hooks, so the editable install of the checkout stays out): the images' dependencies
are checked by tests/deploy/test_deploy_images.py; what is checked here is the project's own
install step, its entry points and its package data. About 40 s of CPU (three wheels and
virtualenvs, one process per console script: importing a package takes seconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
PACKAGES = ("router", "cache", "forecaster", "sim", "opskit")
# image -> (its Dockerfile, the subcommands its manifests run: deploy/base, components/keda)
IMAGES = {
    "router": (ROOT / "deploy/router.Dockerfile", [["serve"]]),
    "forecaster": (ROOT / "deploy/Dockerfile", [["run", "--once"], ["daemon"], ["desired"]]),
}
SIM_SCRIPT = "promptedge-sim"  # in no image: checked from the whole project's wheel

pytestmark = pytest.mark.slow


def copied_paths(dockerfile: Path) -> list[str]:
    """The repository paths the ``COPY`` lines of the Dockerfile's last stage (the image) take
    into the image (not deploy/, not what ``COPY --from`` takes from a builder stage)."""
    paths = []
    for line in dockerfile.read_text().split("\nFROM ")[-1].splitlines():
        match = re.match(r"COPY\s+(?!--from)(.+?)\s+\S+$", line)
        if match:
            paths += [p for p in match.group(1).split() if not p.startswith("deploy/")]
    return paths


def entrypoint(dockerfile: Path) -> list[str]:
    (found,) = re.findall(r"^ENTRYPOINT (\[.*\])$", dockerfile.read_text(), re.M)
    return json.loads(found)


def build_and_install(sources: list[str], work: Path) -> Path:
    """Wheel of ``sources`` (copied from the checkout into ``work/src``), installed into a fresh
    virtualenv ``work/venv``; returns the wheel's path."""
    src = work / "src"
    for rel in sources:
        target = src / rel
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(work / "dist"), str(src)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    (wheel,) = (work / "dist").glob("promptedge-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(work / "venv")], check=True, timeout=60)
    venv_python = work / "venv/bin/python"
    subprocess.run(
        [*pip, "--python", str(venv_python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=work,
    )
    site = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    borrowed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "zz_borrowed_dependencies.pth").write_text("\n".join(sorted(borrowed)) + "\n")
    return wheel


def run_in(work: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` with the fresh virtualenv's bin first on PATH, outside the checkout, without
    PYTHONPATH or PROMPTEDGE_* settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PROMPTEDGE_")}
    env["PATH"] = f"{work / 'venv/bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120, cwd=work, env=env)


@pytest.fixture(scope="module")
def full_install(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(work folder, wheel) of the whole project, as ``pip install .`` from the checkout."""
    work = tmp_path_factory.mktemp("full")
    wheel = build_and_install(["pyproject.toml", "README.md", *PACKAGES], work)
    return work, wheel


def test_every_console_script_is_checked_here() -> None:
    covered = {f"promptedge-{image}" for image in IMAGES} | {SIM_SCRIPT}
    assert covered == set(SCRIPTS)


def test_the_wheel_holds_every_data_file_the_packages_read(full_install: tuple[Path, Path]) -> None:
    work, wheel = full_install
    names = set(zipfile.ZipFile(wheel).namelist())
    data = [
        p.relative_to(ROOT).as_posix()
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc", ".md") and "__pycache__" not in p.parts
    ]
    assert data, "no data files found: the check would pass vacuously"
    missing = sorted(set(data) - names)
    assert not missing, f"add to [tool.setuptools.package-data] in pyproject.toml: {missing}"
    # and the installed code finds them: the demo's default workload is the shipped sample
    loaded = run_in(
        work,
        str(work / "venv/bin/python"),
        "-c",
        "from sim.client.workload import load_inputs; t, q = load_inputs(None, None); print(len(t), len(q))",
    )
    assert loaded.returncode == 0, loaded.stderr
    assert all(int(n) > 0 for n in loaded.stdout.split())


def test_the_sim_script_answers_help_from_the_installed_package(full_install: tuple[Path, Path]) -> None:
    work, _ = full_install
    assert_installed(work, SIM_SCRIPT, [["serve"], ["demo"]])


def assert_installed(work: Path, script: str, commands: list[list[str]]) -> None:
    """In one process of the fresh virtualenv (one import of the package: they take seconds):
    the installed wrapper ``venv/bin/<script>`` itself, run with ``--help``, and then its entry
    point with ``<command> --help`` for each of ``commands``, answer with exit 0 and their usage
    line, and the package comes from the virtualenv, not the checkout."""
    package = script.removeprefix("promptedge-")
    module, func = SCRIPTS[script].split(":")
    wrapper = work / "venv/bin" / script
    code = f"""
import contextlib, io, json, runpy, sys
answers = []
def answer(argv, call):
    sys.argv = argv
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            call()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    answers.append([argv[1:-1], code, out.getvalue()])
answer([{script!r}, "--help"], lambda: runpy.run_path({str(wrapper)!r}, run_name="__main__"))
import {package} as installed_package
from {module} import {func} as entry
for command in {[c[:1] for c in commands]!r}:
    answer([{script!r}, *command, "--help"], entry)
print(json.dumps({{"file": installed_package.__file__, "answers": answers}}))
"""
    done = run_in(work, str(work / "venv/bin/python"), "-c", code)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert Path(report["file"]).is_relative_to(work / "venv"), report["file"]  # not the checkout's source
    assert len(report["answers"]) == 1 + len(commands)
    for command, code, out in report["answers"]:
        assert code == 0 and f"Usage: {' '.join([script, *command])}" in out, (command, code, out[-500:])


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_each_image_installs_what_it_copies_and_its_entrypoint_starts(image: str, tmp_path: Path) -> None:
    """The Dockerfile's own install step (its COPY lines, then ``pip install ".[extras]"``, here
    with ``--no-deps``: the extras' coverage is tests/deploy/test_deploy_images.py's) into a fresh
    virtualenv; its ENTRYPOINT is the package's console script, whose installed wrapper answers
    ``--help``, and so does every command the manifests give it."""
    dockerfile, commands = IMAGES[image]
    extras = re.findall(r'RUN .*pip install "\.\[([a-z,-]+)\]"', dockerfile.read_text().split("\nFROM ")[-1])
    assert extras and all(e in PYPROJECT["project"]["optional-dependencies"] for x in extras for e in x.split(","))
    (script,) = entrypoint(dockerfile)
    assert script == f"promptedge-{image}" and script in SCRIPTS
    build_and_install(copied_paths(dockerfile), tmp_path)
    assert_installed(tmp_path, script, commands)

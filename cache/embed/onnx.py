"""The sentence-transformers model's transformer on ONNX Runtime: same vectors, about half the CPU.

Why our own thin path: sentence-transformers' ``backend="onnx"`` needs optimum-onnx, whose
releases pin transformers 4.x (installing it would downgrade the transformers 5 /
sentence-transformers 6 this project runs on). The ONNX part here is small: export the
transformer once with ``torch.onnx.export``, run it with onnxruntime, and do the pooling
(mean over real tokens, then L2 normalisation) in numpy. Measured on the 2-core AMD EPYC (AVX2)
with all-MiniLM-L6-v2: a single ~30-token text 13 ms instead of 30 ms with torch, identical
vectors (max |cos - 1| 1e-7).

Only ``Transformer -> Pooling(mean) [-> Normalize]`` models are run here (the common
sentence-transformers layout); ``onnx_support`` names the reason for anything else, and
``cache.embed.load.load_encoder`` falls back to torch.

The exported file is cached on disk (``default_cache_dir()``), named by a digest of the
transformer's config and weights plus the exporter's versions, so a different model or version
never reuses it. Files are written atomically, each with the SHA-256 of its bytes beside it
(``<file>.sha256``, written by ``write_onnx``; the torch-free manifest, cache/embed/bundle.py, keeps
it too) and checked on every load (``read_onnx``): the probe texts alone miss a file damaged in
the middle of its weights (bit rot, a partial overwrite), which still loads and passes them but
gives NaN or unrelated vectors for other texts. A file that does not match its digest, has none,
does not load or whose vectors differ from torch's on the probe texts is replaced by a fresh
export. Vectors leave ``OnnxEncoder.encode`` only when finite (``check_finite``).

Precision (issue 34, item 5): "fp32" runs the export as it is; "int8" quantizes the weights of
the transformer's 36 linear layers to int8 per output channel (``quantize_int8``: onnxruntime's
dynamic quantization; activations are quantized per pass, the attention products, embeddings
and LayerNorms stay fp32). On the 2-core dev machine one ~30-token text costs 4.7 CPU ms instead
of 10.4 (bench/embed_precision.py); its vectors are close to fp32's, not equal (cosine to fp32
min 0.989, mean 0.994 over 400 GPTCache texts; 0.965-0.985 on texts of one to three tokens), so
the probe check holds it to ``INT8_PROBE_MIN_COSINE`` (0.95) and the int8 file has a name of its own (its digest covers the
quantization and onnxruntime's version). Not the default: it serves about a fifth fewer of the
default stage's hits (docs/benchmarks.md, issue 34, "Lookup and verification cost").
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cache.embed.encoder import check_finite
from cache.errors import EmbeddingError

log = logging.getLogger("promptedge.cache.embed")

FORMAT = "promptedge-onnx-1"  # bump when the export below changes: old files are not reused
OPSET = 17
# Texts of similar token length are padded together: sorted by length, a group holds at most
# _GROUP_TEXTS texts and _GROUP_TOKENS padded tokens. Measured one ORT thread on this CPU: a
# 32-token text alone runs at 38 GFLOP/s, 8-16 texts of 16-32 tokens together at 55-62; past
# ~500 padded tokens per pass the activations outgrow the cache and it drops again (45-53 at
# 32 x 32). On 256 of GPTCache's paraphrases (32 per call): 14.7 CPU ms per text with groups of
# <= 16 texts / 256 tokens, 15.5 with 8 / 512, 19.1 one by one, 19.7 with 32 / 1,024.
_GROUP_TEXTS = 16
_GROUP_TOKENS = 256
# the vectors of these must match torch's before a file is used (batch of 3, unequal lengths:
# catches an export that baked in the dummy input's shapes)
PROBE_TEXTS = (
    "What is the capital of France?",
    "ok",
    "Explain, step by step and with one worked example, how a least-loaded router chooses a replica "
    "when two of them report the same queue length but different KV-cache usage.",
)
PROBE_MIN_COSINE = 1 - 1e-4
PRECISIONS = ("fp32", "int8")
# int8 against torch's fp32 vectors: measured min 0.989 / mean 0.994 over 400 GPTCache texts, but
# 0.965-0.985 on texts of one to three tokens ("ok" 0.970, "yes" 0.965: a short text's mean is
# over few token vectors, so their rounding errors average out less); a broken quantization
# (wrong scales, a layer dropped) lands far lower
INT8_PROBE_MIN_COSINE = 0.95
# what quantize_int8 does, in the int8 file's digest: another recipe never reuses a file
INT8_RECIPE = "dynamic QInt8 per-channel, MatMul with a weight initializer only"


def probe_min_cosine(precision: str) -> float:
    """The lowest cosine to torch's vectors of PROBE_TEXTS a file of this precision may give."""
    return INT8_PROBE_MIN_COSINE if precision == "int8" else PROBE_MIN_COSINE


def check_precision(precision: str) -> None:
    """Raises EmbeddingError unless precision is one of PRECISIONS."""
    if precision not in PRECISIONS:
        raise EmbeddingError(f"unknown embedding precision {precision!r} (one of {', '.join(PRECISIONS)})")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/promptedge/onnx``, else ``~/.cache/promptedge/onnx``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "promptedge" / "onnx"


def onnx_support(model: Any) -> str | None:
    """None when a loaded SentenceTransformer can run here, else the reason it cannot.

    Supported: a text Transformer module, a Pooling module with mean pooling only, optionally a
    Normalize of the sentence embedding; no default prompt.
    """
    from sentence_transformers.models import Normalize, Pooling, Transformer

    modules = list(model)
    if len(modules) not in (2, 3) or not isinstance(modules[0], Transformer):
        return f"modules {[type(m).__name__ for m in modules]} are not Transformer, Pooling[, Normalize]"
    pooling = modules[1]
    if not isinstance(pooling, Pooling):
        return f"second module is {type(pooling).__name__}, not Pooling"
    # pooling_mode since sentence-transformers 6; older releases only have the string getter
    mode = getattr(pooling, "pooling_mode", None) or pooling.get_pooling_mode_str()
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if modes != ("mean",):
        return f"pooling mode {mode!r} (only 'mean' runs on ONNX)"
    if len(modules) == 3 and not (
        isinstance(modules[2], Normalize)
        and getattr(modules[2], "module_input_name", "sentence_embedding") == "sentence_embedding"
        and getattr(modules[2], "module_output_name", "sentence_embedding") == "sentence_embedding"
    ):
        return f"third module is {type(modules[2]).__name__}, not Normalize of the sentence embedding"
    if getattr(model, "default_prompt_name", None):
        return f"default prompt {model.default_prompt_name!r}"
    if modules[0].tokenizer is None or model.max_seq_length is None:
        return "the transformer has no tokenizer or no max_seq_length"
    return None


def model_digest(auto_model: Any, precision: str = "fp32") -> str:
    """sha256 (hex, 24 chars) of the transformer's config, every weight (name, dtype, shape,
    bytes) and the exporter's versions, and for "int8" the quantization recipe and
    onnxruntime's version: what the exported file is a function of."""
    import torch

    digest = hashlib.sha256()
    digest.update(f"{FORMAT}|opset {OPSET}|torch {torch.__version__}\n".encode())
    if precision != "fp32":  # fp32 keeps the digest of files exported before precisions existed
        import onnxruntime

        digest.update(f"{precision}|{INT8_RECIPE}|onnxruntime {onnxruntime.__version__}\n".encode())
    digest.update(auto_model.config.to_json_string(use_diff=False).encode())
    for name, tensor in sorted(auto_model.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:24]


def export_transformer(auto_model: Any, input_names: Sequence[str]) -> bytes:
    """The transformer as an ONNX model (bytes): inputs ``input_names`` (int64, batch x tokens,
    both dynamic), output ``last_hidden_state`` (float32, batch x tokens x hidden)."""
    import torch

    class _Keywords(torch.nn.Module):
        # the tracer passes positional tensors; BertModel's positional order differs from the
        # tokenizer's, so call it with keywords
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.inner(**dict(zip(input_names, tensors, strict=True))).last_hidden_state

    dummy = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in input_names)
    axes = {name: {0: "batch", 1: "tokens"} for name in (*input_names, "last_hidden_state")}
    buffer = io.BytesIO()
    # the tracer warns about Python branches on shapes inside transformers' attention code; the
    # probe texts in load_onnx_encoder check the result on other shapes instead
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Keywords(auto_model).eval(),
            dummy,
            buffer,
            input_names=list(input_names),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    return buffer.getvalue()


def onnx_file_name(auto_model: Any, precision: str = "fp32") -> str:
    """The cached file's name: ``<digest>.onnx`` for fp32, ``<digest>-int8.onnx`` for int8."""
    suffix = "" if precision == "fp32" else f"-{precision}"
    return f"{model_digest(auto_model, precision)}{suffix}.onnx"


def quantize_int8(data: bytes) -> bytes:
    """The fp32 export ``data`` with the weights of its linear layers (MatMul nodes with a weight
    initializer) quantized to int8 per output channel; activations are quantized per pass
    (onnxruntime's dynamic quantization). Left in fp32: the embedding lookups (quantizing them
    saves no compute and adds error) and the attention's activation-by-activation products
    (measured: they add drift, cosine to fp32 min 0.981 instead of 0.989, for 0.5 ms). Needs the
    ``onnx`` package (installed with torch: ``promptedge[train]``). Raises EmbeddingError."""
    import tempfile

    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise EmbeddingError(f"int8 quantization needs onnx (pip install 'promptedge[train]'): {exc}") from exc
    model = onnx.load_from_string(data)
    weights = {init.name for init in model.graph.initializer}
    linear = [n.name for n in model.graph.node if n.op_type == "MatMul" and any(i in weights for i in n.input)]
    if not linear:
        raise EmbeddingError("int8 quantization: the export has no linear layers to quantize")
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        source.write_bytes(data)
        try:
            quantize_dynamic(
                source,
                target,
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=linear,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise EmbeddingError(f"int8 quantization failed: {exc}") from exc
        return target.read_bytes()


DIGEST_SUFFIX = ".sha256"


def content_digest(data: bytes) -> str:
    """sha256 of a file's bytes, hex (64 chars): what its manifest records and loads check."""
    return hashlib.sha256(data).hexdigest()


def write_onnx(path: Path, data: bytes) -> str:
    """Write an exported file atomically, then its content digest beside it
    (``<name>.sha256``); returns the digest. Raises OSError."""
    digest = content_digest(data)
    write_atomically(path, data)
    write_atomically(path.with_name(path.name + DIGEST_SUFFIX), f"{digest}\n".encode())
    return digest


def recorded_digest(path: Path) -> str:
    """The content digest ``write_onnx`` recorded beside ``path``. Raises EmbeddingError naming
    the file when there is none (a file from before digests, or written by something else)."""
    try:
        return path.with_name(path.name + DIGEST_SUFFIX).read_text().strip()
    except FileNotFoundError:
        raise EmbeddingError(f"{path} has no recorded content digest") from None


def read_onnx(path: Path, expected: str | None = None) -> bytes:
    """An exported file's bytes, checked against ``expected`` (a content digest; None: the one
    ``write_onnx`` wrote beside it). Raises FileNotFoundError when the file is missing, and
    EmbeddingError naming the file when its digest is missing or differs (a damaged file: it
    must not be used)."""
    data = path.read_bytes()
    expected = recorded_digest(path) if expected is None else expected
    actual = content_digest(data)
    if actual != expected:
        raise EmbeddingError(f"{path} is damaged: its sha256 is {actual[:16]}..., recorded {expected[:16]}...")
    return data


def write_atomically(path: Path, data: bytes) -> None:
    """Write data to path so that readers see the old file or the whole new one, never a part.
    Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _ort_errors() -> tuple[type[BaseException], ...]:
    # onnxruntime raises its own exception classes (Fail, InvalidProtobuf, ...), none of which
    # derives from RuntimeError: translated here, at this one boundary
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    own = tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))
    return (*own, RuntimeError, ValueError, OSError)


class OnnxEncoder:
    """A sentence-transformers model's transformer on ONNX Runtime, pooled in numpy.

    ``encode(texts)`` -> (len(texts), dim) float32 unit vectors, never NaN or inf; blocking, safe to call from
    several threads at once (onnxruntime's ``run`` is thread-safe and releases the GIL; each
    call computes on its own thread when ``intra_op_num_threads`` is 1). Raises EmbeddingError.
    ``precision`` says what the session runs ("fp32" or "int8"); ``backend`` is "onnx" or
    "onnx-int8", so vectors kept by backend (embed caches) are never mixed.
    """

    backend = "onnx"

    def __init__(
        self,
        session: Any,
        tokenizer: Any,
        input_names: Sequence[str],
        max_length: int,
        dim: int,
        normalize: bool = True,
        precision: str = "fp32",
    ) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._input_names = list(input_names)
        self._max_length = max_length
        self._pad_id = tokenizer.pad_token_id or 0
        self._normalize = normalize
        self._errors = _ort_errors()
        self.dim = dim
        self.precision = precision
        self.backend = "onnx" if precision == "fp32" else f"onnx-{precision}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        features = self._tokenizer(
            list(texts), truncation=True, max_length=self._max_length, padding=False, return_attention_mask=False
        )
        ids: list[list[int]] = features["input_ids"]
        types: list[list[int]] | None = features.get("token_type_ids")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for group in length_groups([len(x) for x in ids]):
            width = len(ids[group[-1]])
            feed = {name: np.zeros((len(group), width), dtype=np.int64) for name in self._input_names}
            feed["input_ids"].fill(self._pad_id)
            for row, i in enumerate(group):
                n = len(ids[i])
                feed["input_ids"][row, :n] = ids[i]
                if "attention_mask" in feed:
                    feed["attention_mask"][row, :n] = 1
                if "token_type_ids" in feed and types is not None:
                    feed["token_type_ids"][row, :n] = types[i]
            try:
                hidden = self._session.run(["last_hidden_state"], feed)[0]
            except self._errors as exc:
                raise EmbeddingError(f"onnxruntime failed to encode: {exc}") from exc
            out[group] = mean_pool(hidden, np.array([len(ids[i]) for i in group]))
        if self._normalize:
            # as torch.nn.functional.normalize (eps 1e-12), which sentence-transformers uses
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return check_finite(out, self.backend)


def length_groups(
    lengths: Sequence[int], max_texts: int = _GROUP_TEXTS, max_tokens: int = _GROUP_TOKENS
) -> list[list[int]]:
    """Indices of texts, shortest first, in groups padded together: a group holds at most
    max_texts texts and max_texts * its longest length <= max_tokens (a single longer text
    forms its own group)."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda k: lengths[k]):
        group = groups[-1] if groups else None
        if group is not None and len(group) < max_texts and (len(group) + 1) * lengths[i] <= max_tokens:
            group.append(i)
        else:
            groups.append([i])
    return groups


def mean_pool(hidden: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mean of each row's first lengths[r] token vectors: (batch, tokens, dim) -> (batch, dim)
    float32. Right padding, so the real tokens come first."""
    mask = (np.arange(hidden.shape[1])[None, :] < lengths[:, None]).astype(hidden.dtype)
    summed = np.einsum("btd,bt->bd", hidden, mask)
    return (summed / np.maximum(lengths, 1)[:, None]).astype(np.float32)


def _session(source: bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: the exporter's graphs warn about unused initialisers
    # helper threads that spin while waiting for work burn CPU the router needs on a small, shared
    # machine (measured under load: 28 vs 32 CPU ms per text with 2 threads, and no slower)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _probe_ok(encoder: OnnxEncoder, reference: np.ndarray) -> float:
    """Lowest cosine between the encoder's vectors of PROBE_TEXTS and torch's."""
    vectors = encoder.encode(PROBE_TEXTS)
    return float((vectors * reference).sum(axis=1).min())


def load_onnx_encoder(
    model: Any, reference: np.ndarray, cache_dir: Path | None = None, threads: int = 1, precision: str = "fp32"
) -> tuple[OnnxEncoder, bool]:
    """An OnnxEncoder of a loaded, supported SentenceTransformer (see ``onnx_support``) and
    whether it exported (False: reused the cached file).

    reference: torch's vectors of PROBE_TEXTS; a cached file that does not match its recorded
    content digest (``read_onnx``; a file without one, from before digests, too), does not load
    or whose vectors differ (cosine below ``probe_min_cosine(precision)``) is exported again; a fresh export
    that differs raises. precision: "fp32" or "int8" (the export quantized by
    ``quantize_int8``, cached under its own name). An unwritable cache dir is logged and the
    export used from memory. Raises EmbeddingError.
    """
    check_precision(precision)
    transformer = model[0]
    auto_model = transformer.auto_model
    input_names = [
        n for n in transformer.tokenizer.model_input_names if n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    if "input_ids" not in input_names:
        raise EmbeddingError(f"tokenizer inputs {transformer.tokenizer.model_input_names} lack input_ids")
    directory = default_cache_dir() if cache_dir is None else Path(cache_dir)
    path = directory / onnx_file_name(auto_model, precision)
    errors = _ort_errors()
    normalize = len(list(model)) == 3
    floor = probe_min_cosine(precision)

    def build(source: bytes) -> OnnxEncoder:
        return OnnxEncoder(
            _session(source, threads),
            transformer.tokenizer,
            input_names,
            int(model.max_seq_length),
            reference.shape[1],
            normalize,
            precision,
        )

    try:
        encoder = build(read_onnx(path))
        cosine = _probe_ok(encoder, reference)
        if cosine >= floor:
            return encoder, False
        log.warning("cached ONNX model %s gives other vectors (cosine %.6f): exporting again", path, cosine)
    except FileNotFoundError:
        pass
    except (*errors, EmbeddingError) as exc:
        log.warning("cached ONNX model %s is unreadable (%s): exporting again", path, exc)
    try:
        data = export_transformer(auto_model, input_names)
        if precision == "int8":
            data = quantize_int8(data)
        encoder = build(data)
    except errors as exc:
        raise EmbeddingError(f"ONNX export failed: {exc}") from exc
    cosine = _probe_ok(encoder, reference)
    if not cosine >= floor:  # NaN fails too
        raise EmbeddingError(f"ONNX {precision} export gives other vectors than torch (cosine {cosine:.6f})")
    try:
        write_onnx(path, data)
    except OSError as exc:
        log.warning("cannot cache the ONNX model in %s (%s): using it from memory", directory, exc)
    return encoder, True

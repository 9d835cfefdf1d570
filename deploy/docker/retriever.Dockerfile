# syntax=docker/dockerfile:1
# Retriever image: `llds retriever serve` (bm25s, faiss-cpu, sentence-transformers) on the CPU.
# Build from the repository root (docker compose does this):
#   docker build -f deploy/docker/retriever.Dockerfile -t llds-retriever .
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
    && mkdir -p /data/hf /data/indexes /data/datasets /data/models \
    && chown -R llds:llds /data
COPY --from=builder /opt/venv /opt/venv
COPY configs /opt/llds/configs
COPY deploy/scripts /opt/llds/scripts
COPY deploy/docker/healthcheck.py /opt/llds/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    LLDS_CACHE_DIR=/data/hf/llds
USER ${LLDS_UID}:${LLDS_UID}
WORKDIR /home/llds
EXPOSE 8000
# Loading the 65 GB wiki-18 flat index from disk takes minutes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python3", "/opt/llds/healthcheck.py", "http://127.0.0.1:8000/health"]
CMD ["llds", "retriever", "serve", "--faiss-index", "/data/indexes/wiki18/e5_Flat.index", \
     "--corpus", "/data/indexes/wiki18/wiki-18.jsonl", "--encoder", "intfloat/e5-base-v2", \
     "--host", "0.0.0.0", "--port", "8000"]

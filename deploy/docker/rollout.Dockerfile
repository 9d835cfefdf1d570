# syntax=docker/dockerfile:1
# Rollout image: `llds rollout serve` on the official vLLM image (CUDA), the tag matching vllm==0.33.0.
# Build from the repository root (docker compose does this):
#   docker build -f deploy/docker/rollout.Dockerfile -t llds-rollout .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# The project is pure Python: build its wheel and the list of its dependencies in a small image.
FROM ${PYTHON_IMAGE} AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto proto
COPY services services
COPY launcher launcher
COPY benchmarks benchmarks
COPY deploy/docker/requirements.py deploy/docker/requirements.py
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && python deploy/docker/requirements.py --exclude torch > /wheels/requirements.txt

FROM ${VLLM_IMAGE} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The image's Python is the container's only one, and its CUDA torch and vLLM must stay as they are
# (the project's torch pin is the CPU development build): they become constraints.
ENV PIP_BREAK_SYSTEM_PACKAGES=1
COPY --from=builder /wheels /tmp/wheels
RUN python3 -m pip freeze | grep -iE '^(torch|vllm)==' > /tmp/constraints.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/constraints.txt -r /tmp/wheels/requirements.txt \
    && python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels /tmp/constraints.txt
ARG LLDS_UID=10001
RUN groupadd --system --gid "${LLDS_UID}" llds \
    && useradd --system --uid "${LLDS_UID}" --gid llds --create-home --home-dir /home/llds llds \
    && mkdir -p /data/hf /data/models /data/datasets /data/weights \
    && chown -R llds:llds /data
COPY configs /opt/llds/configs
COPY deploy/scripts /opt/llds/scripts
COPY deploy/docker/healthcheck.py /opt/llds/healthcheck.py
ENV PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    LLDS_CACHE_DIR=/data/hf/llds \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER ${LLDS_UID}:${LLDS_UID}
WORKDIR /home/llds
EXPOSE 8001
# Model download (first start), weight loading and CUDA graph capture take minutes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "/opt/llds/healthcheck.py", "http://127.0.0.1:8001/health"]
# The base image's entrypoint is `vllm serve`; this image serves through the llds launcher.
ENTRYPOINT []
CMD ["llds", "rollout", "serve", "--config", "/opt/llds/configs/rollout_search_r1.toml", "--host", "0.0.0.0", "--port", "8001"]

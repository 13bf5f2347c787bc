# rtserve image. Default: the GPU image, onnxruntime-gpu on CUDA 12 / cuDNN 9.
# Build:  docker build -t rtserve:gpu .
#         docker build --build-arg BASE_IMAGE=ubuntu:24.04 --build-arg ORT=cpu -t rtserve:cpu .   (no GPU)
# Run:    docker compose up   (see docker-compose.yml, docker-compose.cpu.yml and docs/deploy.md)
ARG BASE_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE} AS runtime
# onnxruntime build: gpu (onnxruntime-gpu) or cpu (onnxruntime)
ARG ORT=gpu

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    RTSERVE_HOST=0.0.0.0 \
    RTSERVE_PORT=8000 \
    RTSERVE_GRPC_PORT=8001 \
    RTSERVE_MODEL_REPOSITORY=/srv/rtserve/model_repository

RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common make curl \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev gcc \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /srv/rtserve
COPY pyproject.toml README.md Makefile ./
COPY rtserve ./rtserve
COPY service ./service
COPY models ./models
COPY export ./export
COPY loadtest ./loadtest
COPY weights ./weights

# The ONNX Runtime build (`make ORT=gpu` by default), then the model repository
# exported from the committed weights, so the container starts serving at once.
RUN make ORT=${ORT} PYTHON=python3.11 install \
    && .venv/bin/rtserve export --all weights --out "$RTSERVE_MODEL_REPOSITORY"

RUN useradd --create-home --uid 10001 rtserve && chown -R rtserve /srv/rtserve
USER rtserve

# 8000: HTTP (rtserve's API and KServe v2 REST); 8001: KServe v2 gRPC (Triton's clients, perf_analyzer)
EXPOSE 8000 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD curl -fsS "http://127.0.0.1:${RTSERVE_PORT}/readyz" || exit 1
STOPSIGNAL SIGTERM
CMD [".venv/bin/rtserve", "serve"]

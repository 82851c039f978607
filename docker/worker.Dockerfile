# A worker: llama-cpp-python built from source. CPU by default (portable x86_64 flags);
# a GPU image sets its own, e.g. --build-arg CMAKE_ARGS="-DGGML_CUDA=on" on a CUDA base image.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api api
COPY scheduler scheduler
COPY storage storage
COPY worker worker
COPY llamaq llamaq
RUN CMAKE_ARGS="${CMAKE_ARGS}" pip install ".[worker]"
ENTRYPOINT ["llamaq", "worker"]

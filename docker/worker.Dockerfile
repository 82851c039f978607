# A worker: llamaq with llama-cpp-python. The Dockerfile's defaults build it for the CPU
# (portable x86_64 flags); compose.yaml passes the CUDA bases (nvidia/cuda devel/runtime) and
# CMAKE_ARGS=-DGGML_CUDA=on, compose.cpu.yaml these CPU ones.
# Two stages: the compiler and the build tree stay in `build`. The bases are build args, so a
# site without registry access builds FROM its own Debian/Ubuntu (Python >= 3.11).
# Wheels put in docker/wheels/ are used first (a prebuilt llama-cpp-python skips the compiler);
# PIP_OPTIONS="--no-index" builds with no package index at all.
ARG BUILD_BASE=python:3.11.13-slim-bookworm
ARG RUNTIME_BASE=python:3.11.13-slim-bookworm

FROM ${BUILD_BASE} AS build
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
ARG PIP_OPTIONS=""
COPY docker/ensure-packages /usr/local/bin/
COPY docker/wheels/ /wheels/
RUN ensure-packages python venv \
    && if ! ls /wheels/llama_cpp_python-*.whl >/dev/null 2>&1; then ensure-packages compiler; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY scheduler scheduler
COPY storage storage
COPY worker worker
COPY llamaq llamaq
RUN python3 -m venv /opt/llamaq \
    && CMAKE_ARGS="${CMAKE_ARGS}" /opt/llamaq/bin/pip install --no-cache-dir ${PIP_OPTIONS} \
       --find-links /wheels ".[worker]" \
    && if command -v c++ >/dev/null; then /opt/llamaq/bin/python -m worker.runtime.memory_probe; fi

FROM ${RUNTIME_BASE}
COPY docker/ensure-packages /usr/local/bin/
RUN ensure-packages python openmp \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/llamaq llamaq \
    && mkdir -p /var/lib/llamaq/cache && chown llamaq:llamaq /var/lib/llamaq/cache
COPY --from=build /opt/llamaq /opt/llamaq
COPY docker/worker-entrypoint /usr/local/bin/llamaq-worker
ENV PATH=/opt/llamaq/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    LLAMAQ_CACHE_DIR=/var/lib/llamaq/cache \
    HF_HOME=/var/lib/llamaq/cache/huggingface
USER llamaq
WORKDIR /var/lib/llamaq
# Healthy while this worker's heartbeat is in Redis (it registers once its model is loaded).
HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=3 \
    CMD ["llamaq", "health", "--worker-file", "/tmp/llamaq-worker-id"]
ENTRYPOINT ["llamaq-worker"]

# An api pod: Sanic + the job client; no llama.cpp (llama-cpp-python) in this image. The base is a build arg (a
# site without registry access builds FROM its own Debian/Ubuntu with Python >= 3.11); wheels in
# docker/wheels/ are used first, PIP_OPTIONS="--no-index" builds without a package index.
ARG BASE=python:3.11.13-slim-bookworm

FROM ${BASE} AS build
ARG PIP_OPTIONS=""
COPY docker/ensure-packages /usr/local/bin/
COPY docker/wheels/ /wheels/
RUN ensure-packages python venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY scheduler scheduler
COPY storage storage
# worker's sources (not llama-cpp-python): `llamaq` reads every role's flags to name them
COPY worker worker
COPY llamaq llamaq
RUN python3 -m venv /opt/llamaq \
    && /opt/llamaq/bin/pip install --no-cache-dir ${PIP_OPTIONS} --find-links /wheels .

FROM ${BASE}
COPY docker/ensure-packages /usr/local/bin/
RUN ensure-packages python \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/llamaq llamaq
COPY --from=build /opt/llamaq /opt/llamaq
COPY docker/create-bucket /usr/local/bin/llamaq-create-bucket
ENV PATH=/opt/llamaq/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    LLAMA_ARG_HOST=0.0.0.0 \
    LLAMA_ARG_PORT=9931
USER llamaq
WORKDIR /var/lib/llamaq
EXPOSE 9931
# /health answers 200 once a worker of the model has registered (503 before).
HEALTHCHECK --interval=15s --timeout=10s --start-period=30s --retries=3 \
    CMD llamaq health --url "http://127.0.0.1:${LLAMA_ARG_PORT}/health"
ENTRYPOINT ["llamaq", "api"]

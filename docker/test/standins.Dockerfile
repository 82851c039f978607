# Stand-ins for the registry-only images, for scripts/compose-test: Redis and nginx from
# Debian's packages, and moto's S3 server in MinIO's place, on the same local Debian base.
ARG BASE
FROM ${BASE}
ARG PIP_OPTIONS=""
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       redis-server nginx \
    && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/default
COPY docker/wheels/ /wheels/
RUN python3 -m venv /opt/moto \
    && /opt/moto/bin/pip install --no-cache-dir ${PIP_OPTIONS} --find-links /wheels "moto[server]"
ENV PATH=/opt/moto/bin:${PATH}

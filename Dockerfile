# syntax=docker/dockerfile:1
# The FutureQ broker image: `docker build -t futureq:0.1.0 .`
#
#   docker run -p 7450:7450 -p 7452:7452 -v futureq-data:/var/lib/futureq futureq:0.1.0
#
# Stage 1 builds wheels of FutureQ and its runtime dependencies (no test or bench
# extras) and installs them into a virtualenv; stage 2 copies only that virtualenv onto
# a slim Python, runs as an unprivileged user and keeps its data on a volume.
# tests/integration/test_image_recipe.py performs these install steps in a clean
# virtualenv and starts the installed `futureq`, since no container runtime is at hand
# where the tests run. Keep the two in step.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --wheel-dir /wheels . \
 && python -m venv /opt/futureq \
 && /opt/futureq/bin/pip install --no-index --find-links /wheels futureq \
 && /opt/futureq/bin/futureq --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="FutureQ" \
      org.opencontainers.image.description="A Raft-replicated delayed-message queue broker" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 futureq \
 && useradd --system --uid 10001 --gid futureq --no-create-home \
        --home-dir /var/lib/futureq --shell /usr/sbin/nologin futureq \
 && mkdir -p /var/lib/futureq \
 && chown futureq:futureq /var/lib/futureq
COPY --from=build /opt/futureq /opt/futureq
COPY docker/futureq.toml /etc/futureq/futureq.toml
# Only FUTUREQ_CONFIG here: a FUTUREQ_<SECTION>_<KEY> variable set in the image would
# override every config file mounted later (environment beats file).
ENV PATH=/opt/futureq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FUTUREQ_CONFIG=/etc/futureq/futureq.toml
USER 10001:10001
WORKDIR /var/lib/futureq
VOLUME ["/var/lib/futureq"]
# client, raft peers, HTTP (/metrics, /healthz, /readyz): one shard per container
# (docker/futureq.toml pins [node] shards = 1; more shards listen 100 ports higher each)
EXPOSE 7450 7451 7452
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["futureq", "health"]
# SIGTERM starts the graceful shutdown (docker stop -t should exceed shutdown_grace_ms).
STOPSIGNAL SIGTERM
ENTRYPOINT ["futureq"]
CMD ["start"]

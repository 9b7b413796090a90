# The Python images: the service (target `service`) and the simulated core backend
# (target `backend`). Both share every layer but the last, so the backend costs no
# extra disk. Build from the repository root:
#
#   docker build -f docker/python.Dockerfile --target service -t smartcache/service .
#   docker build -f docker/python.Dockerfile --target backend -t smartcache/backend .
#
# BASE_IMAGE: any Debian bookworm image (docker/build-base.sh makes one where no
# registry is reachable). Python is Debian's 3.11; Python packages from PyPI with the
# repository's pins (pyproject.toml + constraints.txt), no dev extras.
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
# The legacy builder keeps this stage as an untagged image: the label lets
# docker/test.sh remove it.
LABEL org.smartcache.stage=build
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv >/dev/null \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# Dependencies first, in their own layer: it stays cached while only our code changes.
COPY pyproject.toml constraints.txt ./
RUN python3 -m venv /opt/venv \
    && python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["server"]))' \
        >/tmp/requirements.txt \
    && /opt/venv/bin/pip install -q -c constraints.txt -r /tmp/requirements.txt
COPY README.md ./
COPY service service
# proto/ is installed as the package smartcache.wire.spec (protocol.toml travels with the code).
COPY proto/__init__.py proto/protocol.toml proto/PROTOCOL.md proto/
RUN /opt/venv/bin/pip install -q --no-deps . \
    && /opt/venv/bin/pip check \
    && find /opt/venv -name __pycache__ -prune -exec rm -rf {} + \
    && rm -rf /opt/venv/lib/python3.11/site-packages/pip /opt/venv/lib/python3.11/site-packages/setuptools

FROM ${BASE_IMAGE} AS runtime
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 tini >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --home-dir /nonexistent --shell /usr/sbin/nologin smartcache
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
# tini is PID 1: it forwards signals and reaps; the program is never PID 1 (where
# the kernel would drop every signal it has no handler for).
ENTRYPOINT ["tini", "--"]

FROM runtime AS service
# Inside a container the service listens on all interfaces: requests on 5555, the event
# stream (PUB, Client.subscribe) on 5557, metrics and health on 9105. Everything else
# comes from SMARTCACHE_* variables (see README.md "Configuration").
ENV SMARTCACHE_LISTEN=tcp://0.0.0.0:5555 \
    SMARTCACHE_EVENTS_LISTEN=tcp://0.0.0.0:5557 \
    SMARTCACHE_METRICS_ADDR=0.0.0.0 \
    SMARTCACHE_METRICS_PORT=9105
EXPOSE 5555 5557 9105
# SIGTERM starts the drain (SMARTCACHE_DRAIN_TIMEOUT_S, default 10 s): give the
# container a stop grace period longer than that (docker-compose.yml: 30 s).
STOPSIGNAL SIGTERM
# Healthy = ready: `GET /health/ready` on the metrics port answers 200 while the
# broker loop runs and a Tarantool leader is known (503 names the failing check).
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/ready' % os.environ['SMARTCACHE_METRICS_PORT'], timeout=2)"]
CMD ["smartcache"]

FROM runtime AS backend
# The simulated core backend is a development tool, not part of the package: its source, run from here.
COPY loadtest /opt/smartcache/loadtest
WORKDIR /opt/smartcache
ENV BACKEND_PORT=8090 \
    BACKEND_LATENCY_MS=200 \
    BACKEND_JITTER_MS=0 \
    BACKEND_ERROR_RATE=0 \
    BACKEND_BAD_REPLY_RATE=0
EXPOSE 8090
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/_stats' % os.environ['BACKEND_PORT'], timeout=3)"]
CMD ["sh", "-c", "exec python3 -m loadtest.backend --host 0.0.0.0 --port \"$BACKEND_PORT\" --latency-ms \"$BACKEND_LATENCY_MS\" --jitter-ms \"$BACKEND_JITTER_MS\" --error-rate \"$BACKEND_ERROR_RATE\" --bad-reply-rate \"$BACKEND_BAD_REPLY_RATE\""]

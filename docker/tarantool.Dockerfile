# The storage image: Debian's Tarantool (bookworm: 2.6.0) with the Lua application
# (lua/init.lua, lua/smartcache/) baked in. One image for every role: master or
# replica is chosen by SC_READ_ONLY / SC_REPLICATION (see lua/README.md). Data
# (.snap, .xlog) in the volume /var/lib/smartcache. Build from the repository root:
#
#   docker build -f docker/tarantool.Dockerfile -t smartcache/tarantool .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The version `make run` and the tests use (Debian bookworm's); override to move.
ARG TARANTOOL_VERSION=2.6.0-1.2+b1
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "tarantool=${TARANTOOL_VERSION}" tini >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --home-dir /var/lib/smartcache --no-create-home \
        --shell /usr/sbin/nologin smartcache \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/smartcache
COPY lua/init.lua /opt/smartcache/lua/init.lua
COPY lua/smartcache /opt/smartcache/lua/smartcache
COPY docker/tarantool/healthcheck.lua /opt/smartcache/healthcheck.lua
# Inside a container: listen on all interfaces, data in the volume, JSON logs on
# stderr. Everything else: SC_* variables (lua/README.md "Environment").
ENV SC_LISTEN=0.0.0.0:3301 \
    SC_HTTP_LISTEN=0.0.0.0:8301 \
    SC_DATA_DIR=/var/lib/smartcache \
    SC_LOG_FORMAT=json
VOLUME /var/lib/smartcache
WORKDIR /var/lib/smartcache
USER 10001:10001
EXPOSE 3301 8301
# Every transaction is in the WAL before it is acknowledged, so SIGTERM (tarantool
# exits at once) loses nothing; tini makes sure the signal reaches it.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["tarantool", "/opt/smartcache/healthcheck.lua"]
ENTRYPOINT ["tini", "--"]
CMD ["tarantool", "/opt/smartcache/lua/init.lua"]

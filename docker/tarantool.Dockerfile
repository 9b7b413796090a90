# The storage image: Debian's Tarantool (bookworm: 2.6.0) with the Lua application
# (lua/init.lua, lua/smartcache/) baked in. One image for every instance: with SC_ETCD
# set, etcd elects the leader and the others follow it (docs/storage-failover.md);
# compose sets SC_ETCD, SC_CLUSTER and SC_ADVERTISE (the name other containers reach
# this one by). Data (.snap, .xlog) in the volume /var/lib/smartcache. Build from the
# repository root:
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
# The whole lua/ directory but its tests (.dockerignore): init.lua, smartcache/, the log
# pipe's relog.sed (sed is in every Debian image).
COPY lua /opt/smartcache/lua
COPY docker/tarantool/healthcheck.lua /opt/smartcache/healthcheck.lua
# Inside a container: listen on all interfaces, data in the volume, JSON logs on
# stderr. Everything else: SC_* variables (lua/README.md "Environment"). The operator
# HTTP on 0.0.0.0 refuses to start without SC_HTTP_TOKEN (or _FILE): compose sets one.
ENV SC_LISTEN=0.0.0.0:3301 \
    SC_HTTP_LISTEN=0.0.0.0:8301 \
    SC_DATA_DIR=/var/lib/smartcache \
    SC_LOG_FORMAT=json
VOLUME /var/lib/smartcache
WORKDIR /var/lib/smartcache
USER 10001:10001
EXPOSE 3301 8301
# Every transaction is in the WAL before it is acknowledged, so SIGTERM loses nothing;
# a leader steps down on SIGTERM and frees the etcd key at once (a follower takes over
# without waiting for the lease TTL). tini makes sure the signal reaches it. Exit code 75
# (`smartcache-cli cluster rejoin`) asks the supervisor for a restart: compose's
# `restart: unless-stopped` does it.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["tarantool", "/opt/smartcache/healthcheck.lua"]
ENTRYPOINT ["tini", "--"]
CMD ["tarantool", "/opt/smartcache/lua/init.lua"]

# etcd for the compose stack: Debian's `etcd-server` (bookworm: 3.4.23), who leads the
# Tarantool instances (SC_ETCD). docker-compose.yml runs three members of this image
# (etcd-1..3, a volume each; it sets each one's name and URLs and the initial cluster);
# alone, with the defaults below, it is a one-member cluster named `etcd`. etcdctl
# (`etcd-client`) is in the image for operators: `docker compose exec etcd-1 etcdctl
# endpoint status --cluster -w table`. Data in the volume /var/lib/etcd. Build from the
# repository root:
#
#   docker build -f docker/etcd.Dockerfile -t smartcache/etcd .
#
# Three members on one host survive a member's crash, not the host's. Production runs
# three or five members on separate hosts (docker/README.md, "etcd").
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The version `make run` and the tests use (Debian bookworm's); override to move.
ARG ETCD_DEB_VERSION=3.4.23-4+b4
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "etcd-server=${ETCD_DEB_VERSION}" "etcd-client=${ETCD_DEB_VERSION}" tini >/dev/null \
    && rm -rf /var/lib/apt/lists/* /var/lib/etcd \
    && useradd --uid 10001 --user-group --home-dir /var/lib/etcd --no-create-home \
        --shell /usr/sbin/nologin smartcache \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/etcd
# etcd reads every flag from an ETCD_* variable: these are the one-member defaults (peers
# and clients reach it as etcd:2380 / etcd:2379); compose overrides ETCD_NAME, the
# advertised URLs and ETCD_INITIAL_CLUSTER for each of its three members (docker/README.md).
# Compaction every hour: the instances renew leases and republish member keys every
# TTL/3, so without it the revision history grows without bound.
ENV ETCD_NAME=etcd \
    ETCD_DATA_DIR=/var/lib/etcd \
    ETCD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
    ETCD_ADVERTISE_CLIENT_URLS=http://etcd:2379 \
    ETCD_LISTEN_PEER_URLS=http://0.0.0.0:2380 \
    ETCD_INITIAL_ADVERTISE_PEER_URLS=http://etcd:2380 \
    ETCD_INITIAL_CLUSTER=etcd=http://etcd:2380 \
    ETCD_INITIAL_CLUSTER_STATE=new \
    ETCD_INITIAL_CLUSTER_TOKEN=smartcache \
    ETCD_AUTO_COMPACTION_MODE=periodic \
    ETCD_AUTO_COMPACTION_RETENTION=1h \
    ETCD_LOGGER=zap \
    ETCD_LOG_OUTPUTS=stderr \
    ETCDCTL_API=3
VOLUME /var/lib/etcd
WORKDIR /var/lib/etcd
USER 10001:10001
EXPOSE 2379 2380
STOPSIGNAL SIGTERM
# GET /health: {"health":"true"} while the member has a leader and answers reads.
# bash's /dev/tcp: no HTTP client needed in the image.
HEALTHCHECK --interval=5s --timeout=3s --start-period=20s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/2379 && printf 'GET /health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && grep -q '\"health\":\"true\"' <&3"]
ENTRYPOINT ["tini", "--"]
CMD ["etcd"]

# Prometheus for the compose stack: Debian's `prometheus` package (bookworm: 2.42)
# with our scrape configuration and alert rules baked in. Data in the volume
# /var/lib/prometheus. Build from the repository root:
#
#   docker build -f docker/prometheus.Dockerfile -t smartcache/prometheus .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The web UI uses moment-timezone-with-data.min.js; the package's raw per-zone data
# next to it is 212 MB that nothing reads.
RUN echo 'path-exclude /usr/share/javascript/moment-timezone/data/*' >/etc/dpkg/dpkg.cfg.d/smartcache-prometheus \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus tini >/dev/null \
    && rm -rf /var/lib/apt/lists/* /etc/prometheus/*.yml \
    && install -d -o prometheus -g prometheus -m 0750 /var/lib/prometheus/metrics2
COPY docker/prometheus/prometheus.yml docker/prometheus/alerts.yml /etc/prometheus/
# Fail the build, not the container start, on a bad configuration or rule file.
RUN promtool check config /etc/prometheus/prometheus.yml
# Retention is the one setting operators change; everything else is in prometheus.yml.
ENV PROMETHEUS_RETENTION=15d
VOLUME /var/lib/prometheus
USER prometheus
EXPOSE 9090
STOPSIGNAL SIGTERM
# promtool 2.42 has no `check healthy`: a query answered is healthy.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["promtool", "query", "instant", "http://127.0.0.1:9090", "vector(1)"]
ENTRYPOINT ["tini", "--"]
CMD ["sh", "-c", "exec prometheus --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/var/lib/prometheus/metrics2 --storage.tsdb.retention.time=\"$PROMETHEUS_RETENTION\" --web.listen-address=0.0.0.0:9090 --log.format=json"]

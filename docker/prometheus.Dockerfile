# Prometheus for the compose stack: Debian's `prometheus` package (bookworm: 2.42)
# with our scrape configuration and alert rules baked in. Data in the volume
# /var/lib/prometheus. Build from the repository root:
#
#   docker build -f docker/prometheus.Dockerfile -t smartcache/prometheus .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
# The web UI uses moment-timezone-with-data.min.js; the package's raw per-zone data
# next to it is 212 MB that nothing reads. The user is uid 10001 like in every image of
# the stack, so one secret file owner fits all (docker/compose.secrets.yml).
RUN echo 'path-exclude /usr/share/javascript/moment-timezone/data/*' >/etc/dpkg/dpkg.cfg.d/smartcache-prometheus \
    && apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus tini >/dev/null \
    && rm -rf /var/lib/apt/lists/* /etc/prometheus/*.yml /var/lib/prometheus \
    && useradd --uid 10001 --user-group --home-dir /var/lib/prometheus --no-create-home \
        --shell /usr/sbin/nologin smartcache \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/prometheus /var/lib/prometheus/metrics2 \
    && install -d -o 10001 -g 10001 -m 0700 /run/smartcache \
    && install -o 10001 -g 10001 -m 0600 /dev/null /run/smartcache/metrics_token
COPY docker/prometheus/prometheus.yml docker/prometheus/alerts.yml docker/prometheus/alerts_test.yml /etc/prometheus/
COPY docker/prometheus/entrypoint.sh /usr/local/bin/prometheus-entrypoint
# Fail the build, not the container start, on a bad configuration or rule file, or on
# an alert rule that does not do what its unit tests (alerts_test.yml) say.
RUN promtool check config /etc/prometheus/prometheus.yml \
    && promtool test rules /etc/prometheus/alerts_test.yml
# Retention is the one setting operators change; everything else is in prometheus.yml.
ENV PROMETHEUS_RETENTION=15d
VOLUME /var/lib/prometheus
USER 10001:10001
EXPOSE 9090
STOPSIGNAL SIGTERM
# promtool 2.42 has no `check healthy`: a query answered is healthy.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["promtool", "query", "instant", "http://127.0.0.1:9090", "vector(1)"]
ENTRYPOINT ["tini", "--", "prometheus-entrypoint"]
CMD []

#!/bin/sh
# Prometheus container start: write the bearer token Prometheus sends to the services'
# /metrics (prometheus.yml: credentials_file) from SMARTCACHE_METRICS_TOKEN_FILE (a Docker
# secret) or SMARTCACHE_METRICS_TOKEN; empty when neither is set (the services then require
# none). Then exec Prometheus with the arguments given (tini stays PID 1).
set -eu
token=/run/smartcache/metrics_token
if [ -n "${SMARTCACHE_METRICS_TOKEN_FILE:-}" ] && [ -n "${SMARTCACHE_METRICS_TOKEN:-}" ]; then
    echo "SMARTCACHE_METRICS_TOKEN and SMARTCACHE_METRICS_TOKEN_FILE are both set: set one" >&2
    exit 2
fi
umask 077
if [ -n "${SMARTCACHE_METRICS_TOKEN_FILE:-}" ]; then
    cat "$SMARTCACHE_METRICS_TOKEN_FILE" >"$token"
else
    printf '%s' "${SMARTCACHE_METRICS_TOKEN:-}" >"$token"
fi
exec prometheus \
    --config.file=/etc/prometheus/prometheus.yml \
    --storage.tsdb.path=/var/lib/prometheus/metrics2 \
    --storage.tsdb.retention.time="$PROMETHEUS_RETENTION" \
    --web.listen-address=0.0.0.0:9090 \
    --log.format=json \
    "$@"

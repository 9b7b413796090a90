#!/usr/bin/env bash
# `make docker-test`: build the images, bring the compose stack up, run the
# end-to-end smoke suite (tests/docker/test_smoke.py) from the host against ports
# published on 127.0.0.1, and tear everything down: containers, networks, volumes,
# and the images this run built (KEEP_IMAGES=1 keeps them for the next run).
#
# Works on a fresh Debian 12 machine as root with no image registry reachable:
# installs docker.io, docker-compose and debootstrap when missing; starts dockerd
# when none runs (and stops that one, by its PID, at the end); builds the base
# image with docker/build-base.sh when debian:bookworm-slim cannot be had.
#
# The stack runs with its secrets from files (docker/compose.secrets.yml, random ones
# made by docker/make-secrets.sh in a private directory) and the services in production
# mode without CURVE (SMARTCACHE_ENV=production, SMARTCACHE_INSECURE=1).
# SECRETS=0 runs the plain development defaults of docker-compose.yml instead.
#
# Variables: BASE_IMAGE (skip the base image search), KEEP_IMAGES=1,
# SMARTCACHE_TAG (image tag, default dtest), COMPOSE_PROJECT_NAME (default
# smartcache-dtest), SECRETS (default 1), PY (python with pytest, default
# .venv/bin/python), PYTEST_ARGS (extra pytest arguments, e.g. -x).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
KEEP_IMAGES=${KEEP_IMAGES:-0}
SECRETS=${SECRETS:-1}
export SMARTCACHE_TAG=${SMARTCACHE_TAG:-dtest}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-smartcache-dtest}
IMAGES="smartcache/service smartcache/backend smartcache/tarantool smartcache/etcd smartcache/prometheus"
# Containers, volumes and networks the smoke suite makes outside compose carry this label.
export SMOKE_LABEL="org.smartcache.dtest=$COMPOSE_PROJECT_NAME"
BASE_TAG=smartcache-base:bookworm
DOCKERD_WAIT_S=60

t0=$(date +%s)
work=$(mktemp -d /tmp/smartcache-docker-test.XXXXXX)
say() { echo "docker-test [$(($(date +%s) - t0)) s] $*"; }

# --- tools ---------------------------------------------------------------------
missing=""
command -v dockerd >/dev/null || missing="$missing docker.io"
command -v debootstrap >/dev/null || missing="$missing debootstrap"
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
else
    command -v docker-compose >/dev/null || missing="$missing docker-compose"
    compose=(docker-compose)
fi
if [ -n "$missing" ]; then
    say "installing:$missing"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
export SMOKE_COMPOSE="${compose[*]}"

# --- teardown, whatever happens from here on -------------------------------------
dockerd_pid=""
had_docker0=""
built_base=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "${stack_up:-}" ]; then
        if [ "$rc" != 0 ]; then
            say "FAILED: container states and last log lines"
            "${compose[@]}" ps || true
            # every line, kept beside the build's log; the last of them printed
            "${compose[@]}" logs --no-color --timestamps >"$work/compose.log" 2>&1 || true
            tail -n 200 "$work/compose.log" || true
            say "every container's log: $work/compose.log"
        fi
        say "tearing down (containers, networks, volumes)"
        COMPOSE_PROFILES=third-shard "${compose[@]}" down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1 || true
    fi
    if docker info >/dev/null 2>&1; then
        # what the smoke suite started by itself (the restore probe), should a test not have cleaned up
        docker ps -aq --filter "label=$SMOKE_LABEL" | xargs -r docker rm -fv >/dev/null 2>&1 || true
        docker volume ls -q --filter "label=$SMOKE_LABEL" | xargs -r docker volume rm -f >/dev/null 2>&1 || true
        docker network ls -q --filter "label=$SMOKE_LABEL" | xargs -r docker network rm >/dev/null 2>&1 || true
    fi
    if [ "$KEEP_IMAGES" != 1 ] && docker info >/dev/null 2>&1; then
        say "removing the images this run built"
        for image in $IMAGES; do docker rmi "$image:$SMARTCACHE_TAG" >/dev/null 2>&1 || true; done
        docker image prune -f --filter label=org.smartcache.stage=build >/dev/null 2>&1 || true
        if [ -n "$built_base" ]; then docker rmi "$BASE_TAG" >/dev/null 2>&1 || true; fi
    fi
    if [ -n "$dockerd_pid" ]; then
        say "stopping the dockerd this run started (pid $dockerd_pid)"
        kill -TERM "$dockerd_pid" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$dockerd_pid" 2>/dev/null && kill -KILL "$dockerd_pid" 2>/dev/null || true
        # dockerd leaves its default bridge behind; remove it when it was not there before us.
        if [ -z "$had_docker0" ] && ip link show docker0 >/dev/null 2>&1; then ip link delete docker0 || true; fi
    fi
    if [ "$rc" = 0 ]; then
        rm -rf "$work"
    else
        rm -rf "$work/secrets"  # the logs stay for whoever reads the failure
        say "logs kept in $work"
    fi
    say "exit $rc"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- dockerd ---------------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
    had_docker0=$(ip link show docker0 2>/dev/null || true)
    say "starting dockerd (log $work/dockerd.log)"
    dockerd >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq $((DOCKERD_WAIT_S * 2))); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$dockerd_pid" 2>/dev/null || { tail -20 "$work/dockerd.log"; exit 1; }
        sleep 0.5
    done
    docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log"; exit 1; }
fi

# --- base image ------------------------------------------------------------------
if [ -z "${BASE_IMAGE:-}" ]; then
    if docker image inspect debian:bookworm-slim >/dev/null 2>&1 ||
        timeout 120 docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
        BASE_IMAGE=debian:bookworm-slim
    else
        say "debian:bookworm-slim cannot be pulled: using $BASE_TAG, built from Debian packages"
        docker image inspect "$BASE_TAG" >/dev/null 2>&1 || built_base=1
        docker/build-base.sh "$BASE_TAG"
        BASE_IMAGE=$BASE_TAG
    fi
fi
export BASE_IMAGE
say "base image: $BASE_IMAGE"

# --- ports: free ones on 127.0.0.1 (others may run `make run` on this machine) ---
eval "$(python3 - <<'EOF'
import socket
names = """SERVICE_1_PORT SERVICE_2_PORT SERVICE_1_METRICS_PORT SERVICE_2_METRICS_PORT
TARANTOOL_1_PORT TARANTOOL_2_PORT TARANTOOL_3_PORT TARANTOOL_1_HTTP_PORT TARANTOOL_2_HTTP_PORT
TARANTOOL_3_HTTP_PORT BACKEND_PORT PROMETHEUS_PORT ETCD_1_PORT ETCD_2_PORT ETCD_3_PORT
SERVICE_1_EVENTS_PORT SERVICE_2_EVENTS_PORT TARANTOOL_4_PORT TARANTOOL_5_PORT TARANTOOL_6_PORT
TARANTOOL_4_HTTP_PORT TARANTOOL_5_HTTP_PORT TARANTOOL_6_HTTP_PORT TARANTOOL_7_PORT TARANTOOL_8_PORT
TARANTOOL_9_PORT TARANTOOL_7_HTTP_PORT TARANTOOL_8_HTTP_PORT TARANTOOL_9_HTTP_PORT CONSOLE_PORT""".split()
socks = [socket.socket() for _ in names]
for s in socks:
    s.bind(("127.0.0.1", 0))
for name, s in zip(names, socks):
    print(f"export {name}={s.getsockname()[1]}")
for s in socks:
    s.close()
EOF
)"
export PUBLISH_ADDR=127.0.0.1

# --- secrets ---------------------------------------------------------------------
# Both shapes of the compose file must be valid: the development defaults, and with secrets.
"${compose[@]}" config -q
if [ "$SECRETS" = 1 ]; then
    docker/make-secrets.sh "$work/secrets" >/dev/null
    export SMARTCACHE_SECRETS_DIR=$work/secrets
    export COMPOSE_FILE=docker-compose.yml:docker/compose.secrets.yml
    export SMARTCACHE_ENV=production SMARTCACHE_INSECURE=1
    "${compose[@]}" config -q
    say "secrets from files (docker/compose.secrets.yml); services in production mode"
fi

# --- build -----------------------------------------------------------------------
say "compose files valid; building images (log $work/build.log)"
b0=$(date +%s)
if ! "${compose[@]}" build >"$work/build.log" 2>&1; then
    tail -60 "$work/build.log"
    exit 1
fi
build_s=$(($(date +%s) - b0))
say "images built in $build_s s:"
for image in $IMAGES; do
    printf '  %-28s %6s MB  user %s\n' "$image:$SMARTCACHE_TAG" \
        "$(docker image inspect -f '{{.Size}}' "$image:$SMARTCACHE_TAG" | awk '{printf "%.0f", $1 / 1e6}')" \
        "$(docker image inspect -f '{{.Config.User}}' "$image:$SMARTCACHE_TAG")"
done

# --- up, smoke, down -------------------------------------------------------------
stack_up=1
say "starting the stack (project $COMPOSE_PROJECT_NAME)"
"${compose[@]}" up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log"; exit 1; }
s0=$(date +%s)
# shellcheck disable=SC2086 # PYTEST_ARGS: words on purpose
"$PY" -m pytest -p no:cacheprovider --durations=0 -rA ${PYTEST_ARGS:-} tests/docker/test_smoke.py
say "smoke suite passed in $(($(date +%s) - s0)) s (build $build_s s)"

# --- the same images, two shards (docker/compose.shards.yml), on fresh volumes ------
say "tearing down; starting the two-shard stack (docker/compose.shards.yml)"
"${compose[@]}" down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1 || true
if [ "$SECRETS" = 1 ]; then
    export COMPOSE_FILE=docker-compose.yml:docker/compose.secrets.yml:docker/compose.shards.yml:docker/compose.shards-secrets.yml
else
    export COMPOSE_FILE=docker-compose.yml:docker/compose.shards.yml
fi
"${compose[@]}" config -q
"${compose[@]}" up -d --no-build >"$work/up-shards.log" 2>&1 || { cat "$work/up-shards.log"; exit 1; }
s0=$(date +%s)
# shellcheck disable=SC2086 # PYTEST_ARGS: words on purpose
"$PY" -m pytest -p no:cacheprovider --durations=0 -rA ${PYTEST_ARGS:-} tests/docker/test_shards.py
say "two-shard suite passed in $(($(date +%s) - s0)) s"

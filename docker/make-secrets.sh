#!/usr/bin/env bash
# Random passwords and tokens for docker/compose.secrets.yml, one file each:
#
#   docker/make-secrets.sh [DIR]      default DIR: $SMARTCACHE_SECRETS_DIR, else docker/secrets
#
# service_password (the service's Tarantool user, both sides), replication_password,
# operator_password (smartcache-cli cluster), http_token (Tarantool's operator HTTP data
# routes), metrics_token (the services' /metrics; Prometheus sends it), session_key (the
# cluster's session key, SMARTCACHE_SESSION_KEY: every service of the stack derives stored
# session ids with it, and smartcache-cli cluster sessions-rekey needs it). 32 random bytes,
# hex. Files owned by uid/gid 10001 (the user of every container), mode 0400: run it as
# root. An existing file is kept (delete it to rotate; docs/docker.md "Secrets"; the
# session key is never rotated by deleting it: the sessions stored under it would be lost,
# docs/operations.md "The session key").
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${SMARTCACHE_SECRETS_DIR:-docker/secrets}}
if [ "$(id -u)" != 0 ]; then
    echo "make-secrets: run as root: the files must belong to uid 10001, the containers' user" >&2
    exit 1
fi
install -d -m 0755 "$dir"
for name in service_password replication_password operator_password http_token metrics_token session_key; do
    f=$dir/$name
    if [ -e "$f" ]; then
        echo "make-secrets: $f exists, kept"
        continue
    fi
    (umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$f")
    chown 10001:10001 "$f"
    chmod 0400 "$f"
    echo "make-secrets: $f"
done

#!/usr/bin/env bash
# Build a Debian bookworm base image from Debian packages, for machines where no
# image registry is reachable (docker pull debian:bookworm-slim fails) but Debian's
# and PyPI's package registries are.
#
#   docker/build-base.sh [TAG]        default TAG: smartcache-base:bookworm
#
# debootstrap --variant=minbase bookworm, then what makes it behave like
# debian:bookworm-slim inside `docker build`: no docs, man pages or locales, no apt
# caches, no service started by a package install (policy-rc.d). This machine's
# network setup is copied in so apt-get and pip work inside docker build exactly as
# on the host: its CA certificates (the bundle, and the local CAs, which survive a
# later `apt-get install ca-certificates`), its Debian apt sources and its
# `Acquire::` apt settings (proxies, validity checks).
# Measured here: debootstrap 24-27 s, import 1-2 s; the image is 106 MB.
# An existing TAG is kept (delete it to rebuild).
set -euo pipefail

tag=${1:-smartcache-base:bookworm}
suite=bookworm

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "build-base: $tag exists"
    exit 0
fi
if ! command -v debootstrap >/dev/null; then
    echo "build-base: installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/smartcache-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

# The mirror this machine's apt uses (deb822 or one-line format); empty = debootstrap's default.
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
elif [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list)
fi

start=$(date +%s)
echo "build-base: debootstrap --variant=minbase $suite ${mirror:-<default mirror>}"
debootstrap --variant=minbase "$suite" "$root" $mirror >"$work/debootstrap.log" 2>&1 || {
    tail -30 "$work/debootstrap.log"
    exit 1
}

# Slim, like the official image: no docs, man pages or translations from later installs.
cat >"$root/etc/dpkg/dpkg.cfg.d/smartcache-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
EOF
cat >"$root/etc/apt/apt.conf.d/smartcache-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF

# No service starts inside docker build (what the official images do too).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# This machine's network setup: CA certificates, Debian sources, Acquire:: settings.
install -d "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
fi
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/debian.sources"
    : >"$root/etc/apt/sources.list"
fi
for f in /etc/apt/apt.conf.d/*; do
    if [ -f "$f" ] && grep -q '^Acquire::' "$f"; then
        cp "$f" "$root/etc/apt/apt.conf.d/host-$(basename "$f")"
    fi
done

rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/tmp/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
mid=$(date +%s)

echo "build-base: docker import -> $tag"
tar -C "$root" --numeric-owner -c . |
    docker import \
        --change 'CMD ["bash"]' \
        --change 'ENV LANG=C.UTF-8' \
        --message "debootstrap --variant=minbase $suite ($(date -u +%Y-%m-%d))" \
        - "$tag" >/dev/null
end=$(date +%s)
echo "build-base: $tag built (debootstrap $((mid - start)) s, import $((end - mid)) s," \
    "$(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"

#!/usr/bin/env bash
# Build the local Debian base image (default proofstream-base:bookworm) without any image registry:
# debootstrap a minbase bookworm root from the Debian mirror, then `docker import` it. Idempotent: does nothing
# when the image already exists (FORCE=1 rebuilds). Needs root, debootstrap and a running Docker daemon.
#
#   BASE_IMAGE     image to create (default proofstream-base:bookworm)
#   SUITE          Debian suite (default bookworm)
#   DEBIAN_MIRROR  mirror URL (default http://deb.debian.org/debian)
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-proofstream-base:bookworm}
SUITE=${SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then
  echo "base.sh: $BASE_IMAGE exists, nothing to do"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base.sh: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "base.sh: debootstrap needs root" >&2; exit 1; }

rootfs=$(mktemp -d /var/tmp/proofstream-rootfs.XXXXXX)
trap 'rm -rf --one-file-system "$rootfs"' EXIT

t0=$(date +%s)
echo "base.sh: debootstrap --variant=minbase $SUITE from $DEBIAN_MIRROR"
debootstrap --variant=minbase "$SUITE" "$rootfs" "$DEBIAN_MIRROR" >"$rootfs.log" 2>&1 || {
  tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1
}
rm -f "$rootfs.log"
# Slim it down: the package lists and caches are refetched by `apt-get update` in the builds on top.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/* "$rootfs"/var/log/*.log
# An image that installs packages in a non-interactive build: never start services, no recommends.
printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d" && chmod 755 "$rootfs/usr/sbin/policy-rc.d"
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$rootfs/etc/apt/apt.conf.d/99proofstream"
t1=$(date +%s)
echo "base.sh: debootstrap took $((t1 - t0)) s"

tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$BASE_IMAGE" >/dev/null
t2=$(date +%s)
echo "base.sh: docker import took $((t2 - t1)) s; $BASE_IMAGE is $(docker image inspect -f '{{.Size}}' "$BASE_IMAGE") bytes"

#!/usr/bin/env bash
# Build the local Debian base image (default proofstream-base:bookworm) without any image registry:
# debootstrap a minbase bookworm root from this machine's own Debian mirror, then `docker import` it.
# Idempotent: does nothing when the image already exists (FORCE=1 rebuilds). Needs root, debootstrap and a
# running Docker daemon.
#
#   BASE_IMAGE     image to create (default proofstream-base:bookworm)
#   SUITE          Debian suite (default bookworm)
#   DEBIAN_MIRROR  mirror URL (default: the first one this machine's apt sources use for SUITE)
#
# `base.sh --mirror` prints the mirror it would use and exits.
set -euo pipefail

BASE_IMAGE=${BASE_IMAGE:-proofstream-base:bookworm}
SUITE=${SUITE:-bookworm}

# The mirror apt already uses here for "$SUITE" itself (not -updates or -security): deb822 stanzas
# (/etc/apt/sources.list.d/*.sources) first, then one-line entries (sources.list, *.list). The repository
# names no mirror of its own.
apt_mirror() {
  local f
  local etc=${APT_ETC:-/etc/apt}
  for f in "$etc"/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v suite="$1" '
      function flush() { if (deb && !off && uri != "" && has) { print uri; found = 1; exit } deb = off = has = 0; uri = "" }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]*#/ { next }
      tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      tolower($1) == "uris:" { uri = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) has = 1 }
      tolower($1) == "enabled:" && tolower($2) == "no" { off = 1 }
      END { if (!found) flush() }' "$f" | head -n 1
  done
  for f in "$etc"/sources.list "$etc"/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [options] URI SUITE COMPONENTS...: the options bracket, if any, is skipped
    sed -e 's/\[[^]]*\]//' "$f" | awk -v suite="$1" '$1 == "deb" && $3 == suite { print $2; exit }'
  done
}
if [ "${1:-}" != --mirror ] && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && [ "${FORCE:-0}" != 1 ]; then
  echo "base.sh: $BASE_IMAGE exists, nothing to do"
  exit 0
fi
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(apt_mirror "$SUITE" | head -n 1)}
[ -n "$DEBIAN_MIRROR" ] || {
  echo "base.sh: no apt source of this machine serves $SUITE; set DEBIAN_MIRROR to a Debian mirror URL" >&2; exit 1
}
if [ "${1:-}" = --mirror ]; then echo "$DEBIAN_MIRROR"; exit 0; fi
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

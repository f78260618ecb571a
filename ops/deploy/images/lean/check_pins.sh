#!/bin/sh
# Check that every artifact the Lean image pins exists, before the build spends an hour on the first of them:
# the tags of leanprover/lean4 (the toolchain elan installs), leanprover-community/mathlib4,
# leanprover-community/repl and leanprover/lean4checker, and elan's release asset. The first one missing
# ends it with one line, e.g.
#
#   pinned artifact missing: leanprover/lean4checker tag v4.28.0
#
# and exit status 1; a host it cannot reach is a different line (exit 2), so that a network fault is never
# read as a wrong pin. Every pin is in ../PINNED.md, with where its source was read.
#
#   check_pins.sh LEAN_VERSION ELAN_VERSION
#
# GIT_BASE and ELAN_RELEASES (defaults: GitHub) are where the repositories and elan's releases are looked
# up; tests/deploy/test_lean_pins.py points them at local stand-ins (file:// URLs).
set -u
LEAN_VERSION=${1:?usage: check_pins.sh LEAN_VERSION ELAN_VERSION}
ELAN_VERSION=${2:?usage: check_pins.sh LEAN_VERSION ELAN_VERSION}
GIT_BASE=${GIT_BASE:-https://github.com}
ELAN_RELEASES=${ELAN_RELEASES:-https://github.com/leanprover/elan/releases/download}
ELAN_ASSET=elan-x86_64-unknown-linux-gnu.tar.gz

missing() {
  echo "pinned artifact missing: $1" >&2
  exit 1
}

unreachable() {
  echo "cannot check pinned artifact $1: $2" >&2
  exit 2
}

# git ls-remote --exit-code answers 2 when the repository has no such ref, anything else non-zero when it
# could not ask (no route, no repository).
tag() {
  repo=$1
  git ls-remote --exit-code --tags "$GIT_BASE/$repo.git" "refs/tags/$LEAN_VERSION" >/dev/null 2>&1
  code=$?
  [ "$code" = 0 ] && return 0
  [ "$code" = 2 ] && missing "$repo tag $LEAN_VERSION"
  unreachable "$repo tag $LEAN_VERSION" "git ls-remote $GIT_BASE/$repo.git failed (exit $code)"
}

tag leanprover/lean4
tag leanprover-community/mathlib4
tag leanprover-community/repl
tag leanprover/lean4checker

# The asset's first byte (a HEAD request is not answered alike by every host a release redirects to). curl
# exits 22 on an HTTP error (404: no such release or asset) and 37 on a file:// path that is not there.
url="$ELAN_RELEASES/$ELAN_VERSION/$ELAN_ASSET"
curl -fsSL --range 0-0 -o /dev/null "$url" 2>/dev/null
code=$?
case "$code" in
  0) ;;
  22 | 37) missing "leanprover/elan release $ELAN_VERSION asset $ELAN_ASSET" ;;
  *) unreachable "leanprover/elan release $ELAN_VERSION asset $ELAN_ASSET" "curl $url failed (exit $code)" ;;
esac
echo "pinned artifacts present: lean4, mathlib4, repl, lean4checker at $LEAN_VERSION; elan $ELAN_VERSION"

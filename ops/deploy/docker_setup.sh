#!/usr/bin/env bash
# Make Docker usable for the docker-backend tests on a fresh Debian machine (called by .ci/run):
#   1. install Debian's docker.io (dockerd, containerd, runc) and debootstrap when missing (needs root);
#   2. start dockerd in the background when no daemon answers, and wait for it (bounded: DOCKERD_WAIT_S);
#   3. build the base image (ops/deploy/images/base.sh: debootstrap minbase piped into `docker import`, no registry)
#      and the checker image (ops/deploy/images/checker/Dockerfile) when missing or out of date;
#   4. install docker-compose (Debian's v1; it reads compose.yaml with -f) when no compose is there, and build the
#      compose images (ops/deploy/images/build.sh --if-changed: proofstream-app, proofstream-redis) when missing or out
#      of date. Without compose or a CPU torch wheel for the app image, only the compose test skips.
# Where Docker cannot be had (not root and no daemon, no package, a daemon that will not start) it prints why
# and exits 0: the docker tests then skip and say so. A failing image build is a real failure (exit 1).
#
#   BASE_IMAGE     default proofstream-base:bookworm
#   CHECKER_IMAGE  default proofstream-checker:latest
#   DOCKERD_WAIT_S default 60
#   DOCKERD_LOG    default /var/log/dockerd.log
set -euo pipefail
cd "$(dirname "$0")/../.."

BASE_IMAGE=${BASE_IMAGE:-proofstream-base:bookworm}
CHECKER_IMAGE=${CHECKER_IMAGE:-proofstream-checker:latest}
DOCKERD_WAIT_S=${DOCKERD_WAIT_S:-60}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/dockerd.log}
export BASE_IMAGE

skip() {
  echo "docker_setup: $* -- the docker backend tests will be skipped" >&2
  exit 0
}
step_start() { step_t0=$(date +%s); }
step_done() { echo "docker_setup: $1 took $(($(date +%s) - step_t0)) s"; }
daemon_up() { timeout 10 docker info >/dev/null 2>&1; }

# 1. packages -----------------------------------------------------------------------------------------------
need_apt=()
if ! command -v docker >/dev/null || { ! command -v dockerd >/dev/null && ! daemon_up; }; then
  need_apt+=(docker.io)
fi
if ! command -v debootstrap >/dev/null && ! { daemon_up && docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; }; then
  need_apt+=(debootstrap)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || skip "${need_apt[*]} missing and not root, cannot install"
  command -v apt-get >/dev/null || skip "${need_apt[*]} missing and no apt-get"
  step_start
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${need_apt[@]}"; } >/tmp/docker_setup.apt.log 2>&1; then
    tail -n 20 /tmp/docker_setup.apt.log >&2
    skip "apt-get install ${need_apt[*]} failed"
  fi
  step_done "apt-get install ${need_apt[*]}"
fi

compose_ok() { timeout 10 docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null; }
if ! compose_ok && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Not fatal: the docker backend tests do not need compose.
  step_start
  if { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      docker-compose; } >/tmp/docker_setup.compose.log 2>&1; then
    step_done "apt-get install docker-compose"
  else
    tail -n 5 /tmp/docker_setup.compose.log >&2
    echo "docker_setup: apt-get install docker-compose failed -- the compose test will be skipped" >&2
  fi
fi

# 2. the daemon ---------------------------------------------------------------------------------------------
if ! daemon_up; then
  [ -n "${DOCKER_HOST:-}" ] && skip "DOCKER_HOST=$DOCKER_HOST does not answer"
  [ "$(id -u)" = 0 ] || skip "no Docker daemon answers and only root can start one"
  command -v dockerd >/dev/null || skip "no dockerd binary"
  step_start
  # Its own session, detached from this script's stdio, so it outlives the script (and CI's pipes).
  setsid dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
  dockerd_pid=$!
  deadline=$(($(date +%s) + DOCKERD_WAIT_S))
  until daemon_up; do
    if ! kill -0 "$dockerd_pid" 2>/dev/null; then
      tail -n 20 "$DOCKERD_LOG" >&2
      skip "dockerd exited at startup (log: $DOCKERD_LOG)"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      tail -n 20 "$DOCKERD_LOG" >&2
      skip "dockerd (pid $dockerd_pid) did not answer within $DOCKERD_WAIT_S s (log: $DOCKERD_LOG)"
    fi
    sleep 0.5
  done
  step_done "starting dockerd (pid $dockerd_pid, storage driver $(docker info -f '{{.Driver}}'))"
fi

# 3. images -------------------------------------------------------------------------------------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  step_start
  ops/deploy/images/base.sh
  step_done "base image $BASE_IMAGE (debootstrap + import)"
fi

# The checker image carries a copy of the Countdown checker: rebuild it when that source (or the Dockerfile) changed.
source_hash=$(sha256sum tasks/__init__.py tasks/countdown_check.py \
  | cat - ops/deploy/images/checker/Dockerfile | sha256sum | cut -c1-16)
current_hash=$(docker image inspect -f '{{index .Config.Labels "proofstream.source-hash"}}' "$CHECKER_IMAGE" 2>/dev/null || true)
if [ "$current_hash" != "$source_hash" ]; then
  step_start
  # The context is only what the image copies (the repository root holds .venv and more).
  tar -c tasks/__init__.py tasks/countdown_check.py ops/deploy/images/checker/Dockerfile \
    | DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE_IMAGE=$BASE_IMAGE" \
        --label "proofstream.source-hash=$source_hash" -t "$CHECKER_IMAGE" -f ops/deploy/images/checker/Dockerfile - >/dev/null
  # The image it replaces is now untagged: drop it (only dangling images of this Dockerfile).
  docker image prune -f --filter "label=proofstream.source-hash" >/dev/null
  step_done "checker image $CHECKER_IMAGE (docker build)"
else
  echo "docker_setup: $CHECKER_IMAGE is up to date"
fi

# 4. the compose images: build.sh stages the context and skips what is up to date (label proofstream.source-hash).
# The app image needs this machine's CPU torch wheel: PyPI's torch is a multi-GB CUDA build.
compose_images="no compose images"
if ! compose_ok; then
  echo "docker_setup: no compose (docker compose / docker-compose) -- the compose test will be skipped" >&2
elif [ -z "${TORCH_WHEEL:-}" ] && ! ls /opt/wheels/torch-*+cpu-cp311-*.whl >/dev/null 2>&1; then
  echo "docker_setup: no CPU torch wheel in /opt/wheels (or TORCH_WHEEL) -- the compose test will be skipped" >&2
else
  step_start
  ops/deploy/images/build.sh --if-changed
  step_done "compose images (ops/deploy/images/build.sh --if-changed)"
  compose_images="${APP_IMAGE:-proofstream-app:latest} ${REDIS_IMAGE:-proofstream-redis:latest}"
fi
echo "docker_setup: ready (server $(docker version -f '{{.Server.Version}}'), images $BASE_IMAGE $CHECKER_IMAGE" \
  "$compose_images)"

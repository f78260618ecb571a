"""The Docker daemon, as the docker sandbox backend (verifier_pool.docker_backend) reaches it through the Docker
SDK (docker-py): connecting, whether it can run an image, the blocking calls on one container (removal, exit
state, main pid, memory), and the orphans a dead worker left behind.

Every function here blocks (run them in a thread from async code). Each sandbox's container carries three
labels: `proofstream.sandbox=1`, `proofstream.owner=<worker>` (`default_owner`: host, pid and the pid's start
time) and `proofstream.sandbox_id=<id>`, so that a restarted worker finds and removes what a dead one left
(`remove_orphans`) while sparing the containers of workers still alive on this host.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
import time

import structlog

from verifier_pool import memcg, proctree
from verifier_pool.sandbox import SandboxUnavailable

log = structlog.get_logger("verifier_pool.docker")

LABEL_SANDBOX = "proofstream.sandbox"
LABEL_OWNER = "proofstream.owner"
LABEL_SANDBOX_ID = "proofstream.sandbox_id"
SETUP_HINT = "run ops/deploy/docker_setup.sh (installs docker.io, starts dockerd, builds the local images)"


def sdk():
    """The Docker SDK's module; SandboxUnavailable where it is not installed."""
    try:
        import docker  # noqa: PLC0415 - optional: only the docker backend needs the SDK
    except ImportError as e:
        raise SandboxUnavailable("the Docker SDK is not installed: pip install 'docker>=7.1'") from e
    return docker


def connect(base_url: str | None, timeout_s: float):
    """A DockerClient (API version negotiated with the daemon). SandboxUnavailable if no daemon answers."""
    docker = sdk()
    try:
        if base_url:
            return docker.DockerClient(base_url=base_url, version="auto", timeout=timeout_s)
        return docker.from_env(version="auto", timeout=timeout_s)
    except Exception as e:  # DockerException, requests' errors, OSError: all mean "no daemon here"
        where = base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        raise SandboxUnavailable(f"no Docker daemon answers at {where} ({short(e)}): {SETUP_HINT}") from e


def why_unavailable(image: str, *, base_url: str | None = None, timeout_s: float = 3.0) -> str | None:
    """None if a daemon answers and has `image`, else why not (for logs and test skips). Never raises."""
    try:
        client = connect(base_url, timeout_s)
    except SandboxUnavailable as e:
        return str(e)
    try:
        client.ping()
        client.images.get(image)
    except sdk().errors.ImageNotFound:
        return f"image {image} not found on the Docker daemon: {SETUP_HINT}"
    except Exception as e:
        return f"the Docker daemon failed to answer ({short(e)})"
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return None


def daemon_ready(image: str, *, base_url: str | None = None) -> bool:
    """True when a Docker daemon answers and has `image` (a few ms; never raises)."""
    return why_unavailable(image, base_url=base_url) is None


# -- owners and orphans -----------------------------------------------------------------------------------


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None if it does not exist."""
    stat = proctree.read_stat(pid)
    return stat[2] if stat is not None else None


_own_start_ticks = functools.cache(_start_ticks)  # this worker's, asked for every sandbox's owner label


def default_owner(prefix: str = "") -> str:
    """This worker's owner id: `<prefix><hostname>:<pid>:<start ticks>`. The start time makes it unique even
    when the pid is reused, and lets remove_orphans tell a live owner on this host from a dead one."""
    pid = os.getpid()
    return f"{prefix}{socket.gethostname()}:{pid}:{_own_start_ticks(pid) or 0}"


_OWNER = re.compile(r"(?P<host>[^:/@]+):(?P<pid>\d+):(?P<start>\d+)$")


def _owner_alive(owner: str) -> bool:
    """True only when `owner` is provably a live process on this host (same hostname, pid, start time)."""
    m = _OWNER.search(owner)
    if m is None or m["host"] != socket.gethostname():
        return False
    return _start_ticks(int(m["pid"])) == int(m["start"])


def remove_orphans(
    owner_prefix: str | None = None, *, base_url: str | None = None, spare_live_owners: bool = True
) -> list[str]:
    """Remove (kill first) every container labelled `proofstream.sandbox=1` whose owner label starts with
    `owner_prefix` (any owner if None), except, with `spare_live_owners`, those whose owner is provably alive
    on this host (this process included). Returns the ids removed. Call it at worker startup. Owners on
    other hosts cannot be proven alive: where several workers share one daemon from different hosts or
    containers, give each a stable prefix and pass it here. SandboxUnavailable if no daemon answers."""
    client = connect(base_url, 30.0)
    removed = []
    try:
        for container in client.containers.list(all=True, filters={"label": f"{LABEL_SANDBOX}=1"}):
            owner = container.labels.get(LABEL_OWNER, "")
            if owner_prefix is not None and not owner.startswith(owner_prefix):
                continue
            if spare_live_owners and _owner_alive(owner):
                continue
            destroy(container)
            removed.append(container.id)
            log.info("sandbox_orphan_removed", container=container.short_id, owner=owner)
    except SandboxUnavailable:
        raise
    except Exception as e:
        raise SandboxUnavailable(f"cannot list or remove orphan sandboxes ({short(e)})") from e
    finally:
        client.close()
    return removed


# -- one container ----------------------------------------------------------------------------------------


def destroy(container) -> None:
    """Kill (SIGKILL to every process in the container) and remove it, in one call: a forced remove is the
    daemon's kill then remove, half the round trips of container.kill() + container.remove(). Should the
    removal fail, container.kill() is tried on its own so that at least nothing keeps running, and the
    error is raised. Gone already, or being removed already, is fine."""
    docker = sdk()
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as e:
        if e.status_code == 409 and "already in progress" in str(e):
            return
        with contextlib.suppress(Exception):
            container.kill()
        raise


def exit_state(container, wait_s: float) -> str:
    """The container's exit status (`exit status N`, and `, killed by the memory limit (OOM)` where it was),
    or `still running` once `wait_s` passed without its exit."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            container.reload()
        except Exception as e:
            return f"state unknown ({short(e)})"
        state = container.attrs.get("State", {})
        if not state.get("Running") or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if state.get("Running"):
        return "still running"
    oom = ", killed by the memory limit (OOM)" if state.get("OOMKilled") else ""
    return f"exit status {state.get('ExitCode')}{oom}"


def main_pid(container) -> int | None:
    """The host pid of the container's first process, None if it is not running or cannot be asked."""
    try:
        container.reload()
    except Exception:
        return None
    return container.attrs.get("State", {}).get("Pid") or None


def memory_bytes(container) -> int | None:
    """The container's memory (memcg.charged) from the daemon's one-shot stats, which take up to a second (as
    its collector ticks); None if it is not running or cannot be asked."""
    try:
        stats = container.stats(stream=False, one_shot=True)
    except Exception:
        return None
    memory = stats.get("memory_stats") or {}
    if "usage" not in memory:  # not running any more
        return None
    return memcg.charged(memory["usage"], memory.get("stats") or {})


def short(e: BaseException) -> str:
    """An exception's text for a message: at most 300 characters."""
    text = str(e).strip() or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."

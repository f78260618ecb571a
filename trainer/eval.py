"""`python -m trainer.eval --version V [--run RUN | --run-dir DIR | --config run.toml] [--redis-url URL]`

pass@k of one policy version on the run's held-out split: n samples per problem, every one verified in a
sandbox, the unbiased estimator of Chen et al. 2021 (https://arxiv.org/abs/2107.03374, eq. 1).

What it reads, and the choices made:

- **The run.** The trainer's own settings machinery (`--config`, `--run`, `--run-dir`, `--redis-url`, env
  `PROOFSTREAM_*`). A finished run's `report.json` holds the settings it trained with; they are the run's,
  and a flag that contradicts one of them where it defines the run (task, data, seed, split, model, prompt
  format) is refused rather than silently evaluating other problems or another model. Without a report
  (the run is live or was killed), the flags/config are used as given.
- **Its Redis.** `--redis-url` (or the report's URL): that Redis. Otherwise the run's embedded Redis: if a
  redis-server still serves `<run dir>/redis` (the run is going on) that one is read; else it is started
  again on that data directory, read, and stopped. Nothing is written to a run's Redis.
- **The held-out split.** Exactly the trainer's: `load_theorems(settings)`'s second part (what it evaluates
  every `eval_every` versions), checked record by record against the canonical records the run registered
  in `{ps:R}:theorems`, so settings that are not the run's fail instead of evaluating other problems.
  `--limit N` keeps the first N. The trainer's own evaluation is greedy with one sample; this one samples
  (`--temperature`, default 1.0) n times.
- **The weights of version V.** The policy entries `{ps:R}:policy` holds, applied as a generator applies
  them (producers/hf.py + producers/policy.py): ES replays the steps of versions 1..V from the base model in
  fp32 (`ESWeights`, the center, no member noise; nothing but the base and the history is trusted, unless
  `--es-snapshots` names a generator's snapshot folder to start from); GRPO loads the safetensors folder
  entry V names after checking its digest. V = 0 is the base.
- **Verification.** The task's real checker, built from the run's settings as the verifier pool builds it
  (verifier_pool/pool.py), in its sandbox; untrusted text runs nowhere else. A sample passes when its
  verdict is `proved` (Countdown: the exact answer). The mean shaped reward is reported beside pass@k. No
  verdict cache is read or written: every sample is checked.

Writes `<run dir>/eval-v<V>.json` (per problem: verdicts, rewards, answers) and prints a table on stderr and
one JSON object as the last stdout line. Bad input exits with 2 and a message; an infrastructure failure
(a sandbox that cannot judge, Redis gone) with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from streams import files, logs
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.keys import Keys
from streams.schema import PolicyUpdate, SchemaError, decode
from streams.settings import SettingsError
from streams.theorems import Theorem
from trainer.config import TrainerSettings
from trainer.local import DATA_LOCK

# Trainer settings that shape training only: `--help` does not offer them (an evaluation has no use for them).
TRAINING_ONLY = ("iterations", "batch", "eval_every", "preset", "population", "sigma", "alpha", "antithetic",
                 "es_temperature", "max_staleness", "quorum", "deadline_s", "order_timeout_s", "lease_s", "history_s",
                 "group_size", "lr", "advantage", "kl_coef", "grad_accum", "train_device", "verifiers",
                 "mlflow_uri", "mlflow_experiment")  # fmt: skip
# What defines a run: a flag that contradicts the finished run's report on one of these is refused.
RUN_FIELDS = ("run", "algo", "task", "seed", "dataset", "problems", "held_out", "curriculum", "model", "prompt_format")
ROWS_PER_CALL = 64  # prompts x samples in one engine call: batched generation, bounded padding and memory
CHECK_TRIES = 3  # an `error` verdict (the checker could not judge) is retried, then the eval stops


class EvalError(Exception):
    """Input the eval cannot work with (unknown run or version, bad k, weights not as announced): exit 2."""


# ------------------------------------------------------------------------------------------ the estimator


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n passes), c of the n passing:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021). Exact integer binomials; Python divides them correctly."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(passed: list[int], n: int, k: int) -> float:
    """pass@k of a split: the estimator averaged over its problems (`passed[i]` of n samples passed)."""
    return sum(pass_at_k(n, c, k) for c in passed) / len(passed)


# ----------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    version: int | None  # None: the newest
    samples: int
    ks: tuple[int, ...]
    temperature: float
    limit: int | None
    sample_seed: int
    device: str
    snapshots: str | None  # ES: a generator's snapshot folder to start the replay from (opt-in)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trainer.eval", description=__doc__.split("\n\n")[1])
    # --run, --run-dir, --redis-url, --config, --max-new-tokens, the task and data, the model, the sandboxes
    TrainerSettings.add_arguments(parser, exclude=TRAINING_ONLY)
    parser.add_argument("--version", dest="eval_version", required=True, help="policy version, or 'latest'")
    parser.add_argument("--samples", dest="eval_samples", type=int, default=8, help="samples per problem (n)")
    parser.add_argument("--k", dest="eval_k", default=None, help="e.g. 1,4,8 (each <= n); default 1,4,8 up to n, and n")
    parser.add_argument("--limit", dest="eval_limit", type=int, default=None, help="first N held-out problems only")
    parser.add_argument("--sample-seed", dest="eval_seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--device", dest="eval_device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--es-snapshots", dest="eval_snapshots", default=None,
                        help="ES: replay from the newest snapshot in this folder (a generator's snapshot_dir) "
                        "instead of from the base; default: from the base, trusting nothing else")  # fmt: skip
    return parser


def _options(args: argparse.Namespace) -> Options:
    n = args.eval_samples
    if n < 1:
        raise EvalError(f"--samples must be at least 1, not {n}")
    if args.eval_k is None:
        ks = sorted({k for k in (1, 4, 8) if k <= n} | {n})
    else:
        try:
            ks = sorted({int(k) for k in args.eval_k.split(",") if k.strip()})
        except ValueError as e:
            raise EvalError(f"--k must be a comma-separated list of integers such as 1,4,8, not {args.eval_k!r}") from e
        if not ks or ks[0] < 1 or ks[-1] > n:
            raise EvalError(f"--k {args.eval_k}: each k must be in 1..n, and n = --samples = {n}")
    version = None if args.eval_version == "latest" else _int(args.eval_version, "--version", low=0)
    try:
        temperature = float(getattr(args, "temperature", 1.0))  # the eval's own default, not the run's
    except ValueError:
        temperature = -1.0
    if temperature < 0 or (args.eval_limit is not None and args.eval_limit < 1):
        raise EvalError("--temperature must be a number >= 0 and --limit an integer >= 1")
    if args.eval_snapshots and not Path(args.eval_snapshots).is_dir():
        raise EvalError(f"--es-snapshots {args.eval_snapshots}: no such folder")
    return Options(
        version, n, tuple(ks), temperature, args.eval_limit, args.eval_seed, args.eval_device, args.eval_snapshots
    )


def _int(text: str, flag: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise EvalError(f"{flag} must be an integer >= {low} (or 'latest'), not {text!r}")
    return value


def run_settings(cli: TrainerSettings, run_dir: Path) -> tuple[TrainerSettings, str]:
    """The run's settings and where they came from: the finished run's report.json, else the flags/config."""
    report = run_dir / "report.json"
    if not report.is_file():
        return cli, f"the flags/config ({report} does not exist: the run has not finished)"
    try:
        doc = orjson.loads(report.read_bytes())["settings"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise EvalError(f"{report} cannot be read as a trainer report: {e}") from e
    given = cli.model_fields_set
    conflicts = [f"{f} = {getattr(cli, f)!r} (the run has {doc.get(f)!r})" for f in RUN_FIELDS
                 if f in given and getattr(cli, f) != doc.get(f)]  # fmt: skip
    if conflicts:
        raise EvalError(f"{report} is the run's own record, and the flags/config/env contradict it: "
                        f"{'; '.join(conflicts)}. Drop those settings to evaluate this run.")  # fmt: skip
    try:
        settings = TrainerSettings.model_validate(
            {**doc, **{f: getattr(cli, f) for f in given}, "run_dir": str(run_dir)}
        )
    except ValidationError as e:
        raise EvalError(f"{report}: settings this build cannot use: {e}") from e
    return settings, f"{report} (the finished run's settings)"


# ----------------------------------------------------------------------------------------------- Redis


def live_server(data_dir: Path) -> str | None:
    """URL of a redis-server running on `data_dir` (its working directory), if any. Its argv is replaced by
    its process title, `redis-server HOST:PORT`, which gives the address."""
    want = data_dir.resolve()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != "redis-server" or Path(os.readlink(proc / "cwd")) != want:
                continue
            title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:  # gone meanwhile, a zombie, or not ours to read
            continue
        host, _, port = title.rsplit(" ", 1)[-1].rpartition(":")
        if not port.isdigit():
            raise EvalError(f"a redis-server (pid {proc.name}) serves {data_dir}, at an address its title "
                            f"{title!r} does not give; pass --redis-url")  # fmt: skip
        return f"redis://{'127.0.0.1' if host in ('', '*', '0.0.0.0', '::') else host}:{port}/0"
    return None


@contextlib.contextmanager
def run_redis(settings: TrainerSettings, run_dir: Path):
    """Yields (url, how): the run's Redis, restarted from the run directory (and stopped) when needed."""
    if settings.redis_url:
        yield settings.redis_url, f"the Redis at {settings.redis_url}"
        return
    data = run_dir / "redis"
    if not run_dir.is_dir():
        raise EvalError(f"no run {settings.run!r}: {run_dir} does not exist. Name the run directory "
                        f"(--run-dir, or --run for runs/<run>), or pass --redis-url for a run whose Redis is "
                        f"elsewhere")  # fmt: skip
    if not ((data / "appendonlydir").is_dir() or (data / "appendonly.aof").is_file()):
        raise EvalError(f"{run_dir} holds no Redis data ({data}): a run trained against another Redis needs "
                        f"--redis-url")  # fmt: skip
    url = live_server(data)
    if url:  # the run is going on: read its server (the trainer holds the data directory's lock)
        yield url, f"the run's embedded Redis, still running, at {url}"
        return
    with open(data / DATA_LOCK, "a+") as lock:
        # Two servers on one AOF would corrupt it: a second eval of the same stopped run waits for the first
        # (a trainer resuming the run refuses to start while an eval holds the lock: trainer/local.py).
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"eval: waiting for another process using {data} (an eval, or a trainer starting)", file=sys.stderr)
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        url = live_server(data)
        if url:
            yield url, f"the run's embedded Redis, still running, at {url}"
            return
        server = EmbeddedRedis(data_dir=data, appendfsync="everysec", start_timeout_s=120.0)
        server.start()
        try:
            yield server.url, f"the run's embedded Redis, restarted from {data} (stopped again at the end)"
        finally:
            server.stop()


@dataclass
class RunView:
    """What the eval reads from the run's Redis."""

    algo: str
    held_out: list[Theorem]
    updates: list[PolicyUpdate]  # policy entries of versions 1..V, stream order
    version: int
    versions: list[int]
    on_disk: list[int]  # GRPO: versions whose weights folder still exists (0: the base)

    def entry(self) -> PolicyUpdate:
        """The policy entry of version V (the last one, as a generator's follower keeps it)."""
        return [u for u in self.updates if u.policy_version == self.version][-1]


async def find_run(redis: Redis, settings: TrainerSettings) -> TrainerSettings:
    """The settings with the run id whose checkpoint this Redis holds: the one named, or, when none was named
    and the Redis holds exactly one run (a local run's embedded Redis), that one."""
    try:
        if await redis.hexists(Keys(settings.run).trainer_state, "state"):
            return settings
        found = sorted({key.decode()[4:-9] async for key in redis.scan_iter(match="{ps:*}:trainer", count=1000)})
    except RedisError as e:
        raise EvalError(f"cannot read the run's Redis: {e}") from e
    if len(found) == 1 and "run" not in settings.model_fields_set:
        return settings.model_copy(update={"run": found[0]})
    holds = f"it holds run(s) {', '.join(repr(r) for r in found)}" if found else "it holds no run"
    raise EvalError(f"run {settings.run!r} has no trainer checkpoint ({Keys(settings.run).trainer_state}) in this "
                    f"Redis; {holds}. Pass --run NAME")  # fmt: skip


async def read_run(redis: Redis, settings: TrainerSettings, opts: Options) -> RunView:
    keys = Keys(settings.run)
    try:
        state = orjson.loads(await redis.hget(keys.trainer_state, "state"))
    except orjson.JSONDecodeError as e:
        raise EvalError(f"the run's checkpoint {keys.trainer_state} cannot be read: {e}") from e
    algo = state.get("algo")
    if algo != settings.algo and "algo" in settings.model_fields_set:
        raise EvalError(f"run {settings.run!r} was trained with algo {algo!r}, not {settings.algo!r}")
    updates = await _policy(redis, keys, algo)
    versions = sorted({0} | {u.policy_version for u in updates})
    version = versions[-1] if opts.version is None else opts.version
    if version not in versions:
        raise EvalError(f"version {version} does not exist in run {settings.run!r}: it has version(s) "
                        f"{_ranges(versions)} (0 is the base model)")  # fmt: skip
    missing = [v for v in range(1, version + 1) if v not in versions]
    if algo == "es" and missing:
        raise EvalError(f"ES version {version} is the base plus the steps of versions 1..{version}; the policy "
                        f"stream lacks {_ranges(missing)}")  # fmt: skip
    held_out = await _held_out(redis, keys, settings, state, opts.limit)
    on_disk = sorted({0} | {u.policy_version for u in updates if algo == "grpo" and Path(u.weights_path).is_dir()})
    return RunView(algo, held_out, [u for u in updates if u.policy_version <= version], version, versions, on_disk)


async def _policy(redis: Redis, keys: Keys, algo: str) -> list[PolicyUpdate]:
    out = []
    for entry_id, fields in await redis.xrange(keys.policy):  # ~200 bytes a version: read it whole
        try:
            update = decode(PolicyUpdate, fields)
        except SchemaError as e:
            raise EvalError(f"policy entry {entry_id.decode()} of {keys.policy} cannot be read: {e}") from e
        if update.algo != algo:
            raise EvalError(f"policy entry {entry_id.decode()} is {update.algo}, in a {algo} run")
        out.append(update)
    return out


async def _held_out(
    redis: Redis, keys: Keys, settings: TrainerSettings, state: dict[str, Any], limit: int | None
) -> list[Theorem]:
    from trainer import data
    from trainer.data import load_theorems  # the trainer's own split, not a copy of it

    try:
        _, held = load_theorems(settings)
    except (data.DataError, ValueError, OSError) as e:
        raise EvalError(f"the run's problems cannot be loaded: {e}") from e
    if not held:
        raise EvalError(f"run {settings.run!r} has no held-out split (held_out = {settings.held_out} of its problems)")
    not_the_runs = ("these settings (seed, problems, held_out, curriculum, dataset) are not the run's; pass its "
                    "--config or the flags it was started with")  # fmt: skip
    raw = await redis.hmget(keys.theorems, [t.theorem_id for t in held])
    for theorem, record in zip(held, raw, strict=True):
        try:
            registered = None if record is None else Theorem.decode(record)
        except SchemaError as e:
            raise EvalError(f"the run's record of {theorem.theorem_id!r} cannot be read: {e}") from e
        if registered != theorem:
            problem = "is not registered" if registered is None else "differs from the one registered"
            raise EvalError(f"held-out problem {theorem.theorem_id!r} {problem} in {keys.theorems}: {not_the_runs}")
    ids = state.get("eval_ids")  # what the run itself evaluated (its checkpoint); absent if it never did
    if ids and ids != [t.theorem_id for t in held]:
        raise EvalError(f"the trainer evaluated {len(ids)} problems {ids[:3]}..., these settings give {len(held)} "
                        f"problems {[t.theorem_id for t in held[:3]]}...: {not_the_runs}")  # fmt: skip
    return held[:limit] if limit else held


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ", ".join(out)


def check_grpo_folder(view: RunView) -> None:
    """Fail before loading a model: the folder entry V names must hold the bytes its digest names. The
    generator's own check (PolicyFollower.load_grpo) runs again right before the weights are loaded."""
    from producers.policy import PolicyMismatch
    from weights.model import weights_digest

    update = view.entry()
    folder = Path(update.weights_path)
    if not folder.is_dir():
        raise EvalError(f"GRPO version {view.version}: its weights folder {folder} does not exist (the trainer "
                        f"deletes the folders no work order can name any more, or the run directory moved); "
                        f"versions with weights on disk: {_ranges(view.on_disk)}")  # fmt: skip
    try:
        found = weights_digest(folder)
    except OSError as e:
        raise PolicyMismatch(f"GRPO version {update.policy_version}: weights at {folder} cannot be read: {e}") from e
    if found != update.digest:
        raise PolicyMismatch(f"GRPO version {update.policy_version}: weights at {folder} have digest {found}, but "
                             f"the policy stream announced {update.digest}; the folder was changed or is "
                             f"incomplete, refusing to evaluate it")  # fmt: skip


# ---------------------------------------------------------------------------------------- weights, engine


async def engine_device(redis: Redis, settings: TrainerSettings, view: RunView, asked: str) -> str:
    """Where to rebuild the policy. ES centers must be replayed on the device type the run's generators drew
    their noise on (`{ps:R}:es_noise`: CUDA and CPU draw different numbers from one seed); anything else
    runs where asked (`auto`: the GPU when there is one, as a generator chooses)."""
    import torch

    noise = (await redis.get(Keys(settings.run).es_noise) or b"").decode() if view.algo == "es" else ""
    if noise and view.version > 0:
        if asked not in ("auto", noise):
            raise EvalError(f"run {settings.run}'s ES noise was drawn on {noise}: its centers replay only there "
                            f"(--device {noise}), not on {asked}")  # fmt: skip
        if noise == "cuda" and not torch.cuda.is_available():
            raise EvalError(f"run {settings.run}'s ES noise was drawn on cuda and this machine has no GPU: "
                            "evaluate it on a machine with one")  # fmt: skip
        return noise
    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return asked


def build_engine(settings: TrainerSettings, opts: Options, device: str):
    """The hf engine on the run's base model on `device` (runs on the engine thread)."""
    import transformers

    from producers.hf import HFEngine
    from weights.model import resolve_model

    transformers.utils.logging.disable_progress_bar()
    # snapshot_every=0: snapshots are only read, never written
    return HFEngine(resolve_model(settings.model), dtype="auto", device=device, snapshot_dir=opts.snapshots)


async def apply_policy(engine, redis: Redis, settings: TrainerSettings, view: RunView) -> str:
    """Put version V in the engine the way a generator does; returns what was applied, for the report."""
    from producers.engine import in_engine_thread
    from producers.policy import PolicyFollower

    if view.version == 0:
        return "the base model (version 0)"
    follower = PolicyFollower(redis, Keys(settings.run), engine)
    if view.algo == "es":
        for update in view.updates:  # in stream order, as a generator's follower hands them over
            if update.es_step is None:
                raise EvalError(f"ES policy version {update.policy_version} carries no es_step")
            try:
                await in_engine_thread(engine.es_add_step, update.policy_version, update.es_step)
            except (ValueError, KeyError, TypeError) as e:  # a malformed or conflicting step: the run's history
                raise EvalError(f"ES policy version {update.policy_version}: {e}") from e
        await in_engine_thread(engine.es_use, view.version, None)
        start = "the base model" if not engine.es.snapshots_loaded else "a snapshot"
        return f"{start} + {engine.es.replayed} ES steps up to version {view.version}, replayed in fp32"
    update = view.entry()
    await follower.take(update)
    await in_engine_thread(follower.load_grpo, view.version, engine.model_path)
    return f"GRPO weights {update.weights_path} ({update.digest}, checked)"


def weights_digest_of(engine) -> str:
    """`weights.es.digest` of the weights the engine samples with, under the checkpoint's tensor names:
    equal digests, equal bits (the test replays ES steps itself and compares)."""
    from safetensors import safe_open

    from weights.es import digest

    names: set[str] = set()
    for file in sorted(Path(engine.model_path).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            names.update(handle.keys())
    state = engine.model.state_dict()
    return digest({name: state[name] for name in names})


# ------------------------------------------------------------------------------------ sampling, verifying


@dataclass
class Verified:
    verdict: str
    reward: float
    reason: str
    detail: str
    answer: str
    tokens: int


@dataclass
class Timing:
    generate_s: float = 0.0
    verify_s: float = 0.0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def verifier_settings(settings: TrainerSettings, config: str | None):
    """What the local pipeline hands its verifier (trainer/local.py), over the config's [verifier] table."""
    from trainer.local import verifier_fields
    from verifier_pool.config import VerifierSettings

    return VerifierSettings.load(config_path=config, flags={"run": settings.run, **verifier_fields(settings)})


async def judge(checker, theorem: Theorem, answer: str) -> tuple[str, float, str, str]:
    """(verdict, reward, reason, detail) from the real checker; `error` (no verdict) is retried, then fatal."""
    from consumers.verifier import reward_of

    for _ in range(CHECK_TRIES):
        j = await checker.check(theorem, answer)
        if j.verdict != "error":
            return j.verdict, reward_of(j), j.reason, j.detail[:300]
    raise RuntimeError(f"the {theorem.task} checker could not judge an attempt at {theorem.theorem_id} "
                       f"{CHECK_TRIES} times (infrastructure, not the attempt): {j.detail}")  # fmt: skip


async def sample_and_verify(engine, checkers: list, held: list[Theorem], settings: TrainerSettings,
                            opts: Options, timing: Timing) -> list[list[Verified]]:  # fmt: skip
    """n samples per problem, generated in batches on the engine thread while the sandboxes check the last batch."""
    from producers import prompts
    from producers.engine import Sampling, in_engine_thread

    tokenizer = engine.tokenizer
    prompt_ids = [prompts.tokenize(tokenizer, prompts.messages(t, settings.prompt_format)) for t in held]
    results: list[list[Verified | None]] = [[None] * opts.samples for _ in held]
    queue: asyncio.Queue = asyncio.Queue()

    async def generate() -> None:
        per_call = max(1, ROWS_PER_CALL // opts.samples)
        for call, start in enumerate(range(0, len(held), per_call)):
            sampling = Sampling(n=opts.samples, temperature=opts.temperature, max_new_tokens=settings.max_new_tokens,
                                seed=opts.sample_seed + call)  # fmt: skip
            started = time.monotonic()
            outputs = await in_engine_thread(engine.generate, prompt_ids[start : start + per_call], sampling)
            timing.generate_s += time.monotonic() - started
            for i, samples in enumerate(outputs, start):
                for k, s in enumerate(samples):
                    timing.tokens += len(s.token_ids)
                    queue.put_nowait((i, k, prompts.extract(held[i].task, s.text), len(s.token_ids)))
        for _ in checkers:
            queue.put_nowait(None)

    async def verify(checker) -> None:
        while (item := await queue.get()) is not None:
            i, k, answer, tokens = item
            started = time.monotonic()
            verdict, reward, reason, detail = await judge(checker, held[i], answer)
            timing.verify_s += time.monotonic() - started
            results[i][k] = Verified(verdict, reward, reason, detail, answer, tokens)

    tasks = [asyncio.create_task(generate()), *(asyncio.create_task(verify(c)) for c in checkers)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one failed: the others stop too
            t.cancel()
    return results  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------- the eval


async def evaluate(settings: TrainerSettings, opts: Options, url: str, config: str | None) -> dict[str, Any]:
    from producers.engine import in_engine_thread
    from trainer.local import lean_backend_problem
    from verifier_pool.pool import backends, make_checkers

    timing = Timing()
    redis = connect(url)
    try:
        settings = await find_run(redis, settings)
        view = await read_run(redis, settings, opts)
        if view.algo == "grpo" and view.version > 0:
            check_grpo_folder(view)
        if settings.task == "lean" and (problem := lean_backend_problem(settings)):
            raise EvalError(problem)
        vsettings = verifier_settings(settings, config)
        started = time.monotonic()
        device = await engine_device(redis, settings, view, opts.device)
        engine = await in_engine_thread(build_engine, settings, opts, device)
        timing.extra["load_s"] = time.monotonic() - started
        try:
            started = time.monotonic()
            applied = await apply_policy(engine, redis, settings, view)
            digest = await in_engine_thread(weights_digest_of, engine)
            timing.extra["weights_s"] = time.monotonic() - started
            kinds = backends(vsettings)
            checkers = [make_checkers(vsettings, i, kinds)[settings.task]
                        for i in range(min(vsettings.workers, len(view.held_out) * opts.samples))]  # fmt: skip
            try:
                await asyncio.gather(*(c.sandbox.start() for c in checkers))
                results = await sample_and_verify(engine, checkers, view.held_out, settings, opts, timing)
            finally:
                await asyncio.gather(*(c.sandbox.kill() for c in checkers), return_exceptions=True)
        finally:
            await in_engine_thread(engine.close)
        model = str(engine.model_path)
    finally:
        await redis.aclose()
    return {"settings": settings, "view": view, "results": results, "timing": timing, "applied": applied,
            "digest": digest, "model": model, "sandbox": kinds.get(settings.task, "")}  # fmt: skip


def summarize(
    opts: Options, out: dict[str, Any], sources: dict[str, str], seconds: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stdout line, the file's document)."""
    settings, view, results, timing = out["settings"], out["view"], out["results"], out["timing"]
    passed = [sum(s.verdict == "proved" for s in row) for row in results]
    rewards = [s.reward for row in results for s in row]
    line = {
        "version": view.version,
        "algo": view.algo,
        "task": settings.task,
        "problems": len(results),
        "samples": opts.samples,
        "pass_at_k": {str(k): round(mean_pass_at_k(passed, opts.samples, k), 6) for k in opts.ks},
        "reward_mean": round(sum(rewards) / len(rewards), 6),
        "seconds": round(seconds, 2),
    }
    verdicts: dict[str, int] = {}
    for row in results:
        for s in row:
            verdicts[s.verdict] = verdicts.get(s.verdict, 0) + 1
    doc = {
        **line,
        "run": settings.run,
        "exact": {"passed": sum(passed), "attempts": len(rewards)},
        "verdicts": verdicts,
        "sampling": {
            "temperature": opts.temperature,
            "max_new_tokens": settings.max_new_tokens,
            "seed": opts.sample_seed,
            "prompt_format": settings.prompt_format,
            "engine": "hf",
        },
        "weights": {
            "model": out["model"],
            "applied": out["applied"],
            "digest": out["digest"],
            "versions_in_run": _ranges(view.versions),
        },
        "held_out": {
            "source": sources["settings"],
            "limit": opts.limit,
            "seed": settings.seed,
            "problems": settings.problems,
            "held_out": settings.held_out,
            "curriculum": settings.curriculum,
            "dataset": settings.dataset,
        },
        "redis": sources["redis"],
        "sandbox": out["sandbox"],
        "timing": {
            "generate_s": round(timing.generate_s, 2),
            "verify_busy_s": round(timing.verify_s, 2),
            "tokens": timing.tokens,
            **{k: round(v, 2) for k, v in timing.extra.items()},
        },
        "per_problem": [
            {"theorem_id": t.theorem_id, "passed": c, "samples": [asdict(s) for s in row]}
            for t, c, row in zip(view.held_out, passed, results, strict=True)
        ],
        "created": time.time(),
    }
    return line, doc


def table(line: dict[str, Any], doc: dict[str, Any]) -> str:
    t = doc["timing"]
    rows = [
        f"eval: run {doc['run']!r} ({line['algo']}, {line['task']}), version {line['version']}: "
        f"{doc['weights']['applied']}",
        f"eval: held-out split of {line['problems']} problems from {doc['held_out']['source']}",
        f"eval: read {doc['redis']}; checked in the {doc['sandbox']} sandbox",
        f"eval: {line['problems']} x {line['samples']} samples at T={doc['sampling']['temperature']:g}, at most "
        f"{doc['sampling']['max_new_tokens']} new tokens: {t['tokens']} tokens in {t['generate_s']} s, sandboxes busy "
        f"{t['verify_busy_s']} s, model load {t.get('load_s', 0)} s, weights {t.get('weights_s', 0)} s",
        "",
        f"  {'k':>4}  {'pass@k':>8}",
        *(f"  {k:>4}  {v:>8.4f}" for k, v in line["pass_at_k"].items()),
        "",
        f"  exact: {doc['exact']['passed']}/{doc['exact']['attempts']} samples proved; "
        f"verdicts: {', '.join(f'{v} {n}' for v, n in sorted(doc['verdicts'].items()))}",
        f"  mean shaped reward: {line['reward_mean']:.4f} (partial credit; pass@k counts only `proved`)",
        f"  {line['seconds']} s in all",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from producers.policy import PolicyMismatch
    from verifier_pool.sandbox import SandboxError
    from weights.model import MissingDependency, ModelNotFound

    started = time.monotonic()
    args = _parser().parse_args(argv)
    try:
        opts = _options(args)
        given = {k: v for k, v in vars(args).items() if k in TrainerSettings.model_fields and k != "temperature"}
        cli = TrainerSettings.load(config_path=args.config, flags=given)
        logs.configure(args.log_level if "log_level" in vars(args) else "warning")
        run_dir = cli.directory()
        settings, settings_source = run_settings(cli, run_dir)
        with run_redis(settings, run_dir) as (url, how):
            out = asyncio.run(evaluate(settings, opts, url, args.config))
    except (EvalError, SettingsError, PolicyMismatch, ModelNotFound, MissingDependency) as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    except (RuntimeError, SandboxError, RedisError, OSError) as e:  # infrastructure: a sandbox, Redis, the disk
        print(f"eval: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    line, doc = summarize(opts, out, {"settings": settings_source, "redis": how}, time.monotonic() - started)
    path = run_dir / f"eval-v{line['version']}.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    files.write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(table(line, doc) + f"\n  written to {path}", file=sys.stderr)
    print(orjson.dumps(line).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

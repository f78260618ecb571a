"""The trainer's settings (TOML table `[trainer]`, env `PROOFSTREAM_<FIELD>`, `python -m trainer --flag`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from streams.role_settings import SandboxSettings
from streams.settings import shown_default
from tasks.prompts import PromptSettings
from weights.settings import ModelSettings

# ES presets (trainer/es.py): the values of `population`, `sigma`, `alpha`, `batch`, `antithetic` and Countdown's
# `reward` a run takes unless set, filled in by `with_preset` alone. Here, not in trainer/es.py, because the
# settings fill their defaults from them and trainer/es.py imports the settings.
PRESETS: dict[str, dict[str, Any]] = {
    # The paper's defaults (Qiu et al. 2025, Countdown and reasoning tasks on 0.5B-8B models).
    # Its Countdown reward is TinyZero's: 0.1 for the format, 1 solved (tasks/countdown_check.py SCHEMES).
    "paper": {
        "population": 30,
        "sigma": 0.001,
        "alpha": 0.0005,
        "batch": 200,
        "antithetic": False,
        "reward": "paper",
    },
    # A population a 2-core CPU gets through in minutes with the 135M default model. alpha 4x the paper's:
    # measured over 3 seeds at 8 versions (docs/results/sweep-cpu: greedy members, batch 16, antithetic),
    # the held-out shaped reward gained 0.004 +- 0.002 at 0.0005, 0.032 +- 0.006 at 0.002, 0.015 +- 0.020 at
    # 0.008; the paper's alpha is made for 1,000 iterations, not a budget of minutes.
    "cpu": {"population": 8, "sigma": 0.001, "alpha": 0.002, "batch": 16, "antithetic": True, "reward": "shaped"},
}
GRPO_BATCH = 8  # theorems (groups) per GRPO step unless `batch` says otherwise
ROWS_PER_ORDER = 256  # members x problems one ES work order asks of an engine call, unless members_per_order


def with_preset(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (settings as given, or as a run stored them: run.json, report.json) with what its algorithm's
    defaults and its ES preset decide filled in where unset: an ES run takes `population`, `sigma`, `alpha` and
    `batch` from the preset, GRPO its own batch; both the preset's `antithetic` and `reward` (Countdown's; a
    Lean run ignores it). The one place a preset is applied. `data` unchanged where its preset is unknown
    (validation says what is wrong)."""
    if data.get("preset") is not None and data["preset"] not in PRESETS:
        return data
    preset, data = PRESETS[data.get("preset") or "cpu"], dict(data)
    es = (data.get("algo") or "es") == "es"
    for key in ("population", "sigma", "alpha", "batch") if es else ():
        if data.get(key) is None:
            data[key] = preset[key]
    if data.get("batch") is None:
        data["batch"] = GRPO_BATCH
    if data.get("antithetic") is None:
        data["antithetic"] = preset["antithetic"]
    if data.get("reward") is None:
        data["reward"] = preset["reward"]
    return data


def _preset_default(key: str) -> dict[str, Any]:
    """`--help`'s default of a field the ES presets decide (`with_preset`)."""
    values = ", ".join(f"{name} {shown_default(p[key])}" for name, p in PRESETS.items())
    return {"default_text": f"the preset's ({values})"}


class TrainerSettings(ModelSettings, PromptSettings, SandboxSettings):
    """The run's settings. `engine`, `model`, `prompt_format` and the sandbox's (`sandbox`, `kimina_url`,
    `lean_*`) are declared below the roles (weights.settings, tasks.prompts, streams.role_settings), once for
    the trainer and the role that runs with them: the trainer trains the model and starts generators and
    verifiers of its own when it runs the whole pipeline."""

    section = "trainer"
    # `python -m trainer --help`'s headings, in order; tests/streams/test_settings.py checks each field has one.
    groups = {
        "run": (
            "run",
            "algo",
            "task",
            "iterations",
            "seed",
            "dataset",
            "problems",
            "held_out",
            "curriculum",
            "reward",
            "batch",
            "eval_every",
            "eval_every_minutes",
            "max_minutes",
        ),
        "ES": (
            "preset",
            "population",
            "sigma",
            "alpha",
            "antithetic",
            "es_temperature",
            "es_noise",
            "es_rank",
            "members_per_order",
        ),
        "GRPO": (
            "group_size",
            "lr",
            "advantage",
            "kl_coef",
            "grad_accum",
            "grpo_epochs",
            "train_device",
            "train_precision",
            "dist_timeout_s",
        ),
        "async rules": ("max_staleness", "quorum", "deadline_s", "order_timeout_s", "stall_timeout_s", "lease_s"),
        "generation": ("engine", "model", "temperature", "max_new_tokens", "prompt_format"),
        "verifiers": ("verifiers", "verifier_concurrency", "sandbox"),
        "Lean": ("kimina_url", "lean_repl_cmd", "lean_workdir", "lean_image", "lean_audit_cmd", "lean_second_line"),
        "Redis": ("redis_url", "settle_replicas", "settle_wait_ms", "history_s"),
        "output": ("run_dir", "log_level", "mlflow_uri", "mlflow_experiment"),
    }

    algo: Literal["es", "grpo"] = Field("es", description="the algorithm: Evolution Strategies or GRPO")
    task: Literal["countdown", "lean"] = Field(
        "countdown", description="countdown: arithmetic, runs anywhere; lean: theorems, needs a Lean backend"
    )
    run_dir: str = Field(
        "", description="reports, metrics, plots, traces, checkpoints", json_schema_extra={"default_text": "runs/<run>"}
    )
    iterations: int = Field(10, ge=1, description="policy versions to produce")
    seed: int = Field(0, description="the problems, the held-out split and the ES member seeds follow from it")

    # data
    dataset: str = Field("", description="jsonl of theorems (miniF2F, STP, Lean Workbook); lean task only")
    problems: int = Field(256, ge=1, description="countdown: training problems generated from the seed")
    held_out: int = Field(32, ge=0, description="problems kept out of training for evaluation")
    curriculum: Literal["easy", "ramp", "none"] = Field(
        "easy", description="countdown: easy = 2-3 numbers, + - * only (what the 135M default can reach)"
    )
    reward: Literal["shaped", "paper"] | None = Field(
        None,
        description="countdown's reward: shaped, partial credit by part (tags 0.1, expression 0.1, numbers 0.3, "
        "closeness up to 0.3, 1 solved); paper, TinyZero's and Qiu et al.'s (0.1 for the tags, 1 solved, nothing "
        "between)",
        json_schema_extra=_preset_default("reward"),
    )
    batch: int = Field(
        GRPO_BATCH,
        ge=1,
        description="theorems per member (ES) or per step (GRPO)",
        json_schema_extra={"default_text": f"ES: {_preset_default('batch')['default_text']}; GRPO: {GRPO_BATCH}"},
    )
    eval_every: int = Field(5, ge=0, description="evaluate the center on the held-out split every K versions")
    eval_every_minutes: float = Field(
        0.0,
        ge=0,
        description="also evaluate after the first update this many minutes after the last evaluation was "
        "issued (a wall-clock run's curve over time; with eval_every 0, the only schedule); 0: off",
    )
    max_minutes: float = Field(
        0.0,
        ge=0,
        description="wall-clock budget from the trainer's start: once spent, the version under way is finished, "
        "the final evaluation runs and the run ends as finished (iterations stays the cap); 0: no budget",
    )

    # sampling
    temperature: float = Field(
        0.7,
        ge=0,
        description="GRPO's sampling temperature (ES: es_temperature); 0.7 learned on 3 of 3 seeds where "
        "1.0 stalled on one (docs/results/sweep-grpo)",
    )
    max_new_tokens: int = Field(96, ge=1, description="tokens a sample may generate at most")

    # ES
    preset: Literal["cpu", "paper"] = Field("cpu", description="cpu: N=8; paper: N=30 (sigma, alpha as the paper)")
    population: int | None = Field(
        None, ge=2, description="ES members a version (N)", json_schema_extra=_preset_default("population")
    )
    sigma: float | None = Field(
        None,
        gt=0,
        description="ES noise scale: a member is the center + sigma * eps",
        json_schema_extra=_preset_default("sigma"),
    )
    alpha: float | None = Field(
        None,
        gt=0,
        description="ES step size: theta += alpha/N * sum z_n eps_n",
        json_schema_extra=_preset_default("alpha"),
    )
    antithetic: bool = Field(
        False, description="ES: mirrored member pairs (+eps, -eps)", json_schema_extra=_preset_default("antithetic")
    )
    es_temperature: float = Field(
        0.0, ge=0, description="ES members' sampling temperature; 0: greedy, as the reference ES (GRPO: temperature)"
    )
    es_noise: Literal["full", "lowrank"] = Field(
        "full",
        description="ES members' noise: full, every tensor (Qiu et al.); lowrank, a rank-es_rank product "
        "A B^T on each linear layer's matrix (EGGROLL), which engines serve a population at a time",
    )
    es_rank: int = Field(4, ge=1, description="lowrank noise: the rank r of each member's A B^T")
    members_per_order: int = Field(
        0,
        ge=0,
        description="ES members one work order carries, generated in one engine call; 0: lowrank, the "
        f"population, at most {ROWS_PER_ORDER} rows (members x batch) an order; full, 1 (each member's weights "
        "are written in turn)",
    )
    # 2: with `population` members kept in flight and an update at a quorum of them, members issued late in a
    # version finish two updates later; at 1 they were dropped (7.7% of the generated work, ops bench pipeline)
    max_staleness: int = Field(2, ge=0, description="an update may use samples of a policy this many versions old")
    quorum: float = Field(
        0.75,
        gt=0,
        le=1,
        description="share of the population (ES) or batch (GRPO) an update waits for; 1: lockstep, every version "
        "uses exactly its own samples",
    )
    deadline_s: float = Field(
        900.0,
        gt=0,
        description="an update goes ahead without its quorum after this long (ES: with at least two members)",
    )
    order_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="an order unanswered this long after it was issued is cut and issued anew "
        "(a generator died with it in hand and none reclaimed it)",
    )
    stall_timeout_s: float = Field(
        60.0,
        ge=0,
        description="no reward or version for this long while the infrastructure says why (dead "
        "letters blaming it, no verifier with a sandbox, a generator that stopped): a local run stops with the "
        "cause, a trainer with --redis-url raises the run's alert (trainer/progress.py); 0: never",
    )
    lease_s: float = Field(15.0, gt=0, description="one trainer a run: a second waits this long for the first's lease")
    history_s: float = Field(3600.0, ge=0, description="acked rewards and work orders kept for inspection this long")
    mlflow_uri: str = Field(
        "",
        description="log to MLflow at this tracking URI (sqlite:///runs/mlflow.db, http://host:5000; needs the "
        "mlflow extra); empty: no MLflow",
    )
    mlflow_experiment: str = Field("proofstream", description="the MLflow experiment of the run")

    # GRPO
    group_size: int = Field(8, ge=2, description="G: samples per theorem")
    lr: float = Field(
        1e-5,
        gt=0,
        description="AdamW; 1e-5 measured on the 135M default (docs/results/compare-countdown-1024); models of "
        "billions of parameters want ~1e-6",
    )
    advantage: Literal["grpo", "dr_grpo"] = Field("grpo", description="grpo: std-normalized; dr_grpo: mean only")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the base model; 0: off")
    grad_accum: int = Field(1, ge=1, description="micro-batches per step (at least: passes of 8 sequences)")
    grpo_epochs: int = Field(
        1,
        ge=1,
        description="optimizer steps on each batch (PPO's epochs, DeepSeekMath's mu); past the first, the "
        "clip-higher bounds of the ratio to the step's starting weights bind (trainer/grpo_loss.py); 1: the "
        "truncated-IS policy gradient, clipping never binds",
    )
    train_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="the GRPO trainer's; auto: cuda when available"
    )
    train_precision: Literal["auto", "fp32", "bf16-mixed"] = Field(
        "auto",
        description="the GRPO step's: bf16-mixed computes the forward and backward passes in bfloat16 "
        "(autocast; weights, gradients and AdamW stay fp32): faster where the hardware has bf16 (a GPU, a CPU with "
        "AVX512-BF16 or AMX; python -m ops bench grpo); auto: bf16-mixed where it has, else fp32",
    )
    dist_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="under torchrun: how long a rank waits in a collective for a dead or stuck peer "
        "before it fails (torch.distributed's process-group timeout)",
    )

    # the local pipeline (no redis_url): children the trainer starts
    verifiers: int = Field(1, ge=1, description="verifier worker processes (local mode)")
    verifier_concurrency: int = Field(2, ge=1, description="sandboxes per verifier process (local mode)")

    @model_validator(mode="before")
    @classmethod
    def _algorithm_defaults(cls, data: Any) -> Any:
        """Fill what depends on the algorithm: ES takes its population, noise, step, batch and pairing from the
        preset."""
        return with_preset(data) if isinstance(data, dict) else data  # else field validation says what is wrong

    @model_validator(mode="after")
    def _lean_needs_data(self) -> TrainerSettings:
        if self.task == "countdown" and self.dataset:
            raise ValueError("dataset is for the lean task; countdown problems are generated from the seed")
        return self

    @property
    def evaluates(self) -> bool:
        """The run evaluates on the held-out split (at version 0, on a schedule, and at the end)."""
        return self.eval_every > 0 or self.eval_every_minutes > 0

    def directory(self) -> Path:
        return Path(self.run_dir or Path("runs") / self.run).expanduser()

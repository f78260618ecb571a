"""A run's result as a user reads it first: what ran (algorithm, task, model, the main settings), how far it
got, the held-out evaluation at its first, last and best point with the problems solved, the training
samples, the wall time (and, while it runs, an ETA), and how to read the numbers. One summary, built from
what the trainer keeps, so the trainer's end line, `python -m ops run`, `ops runs` and the dashboard say the
same thing.

What it is built from: the run's settings (`run.json`, which the trainer writes at each start and mirrors to
`{ps:R}:run`; or the finished run's `report.json`), its version, counts and evaluations (the trainer's state
or report), and the times of its updates (metrics records), for the ETA.
"""

from __future__ import annotations

import time
from typing import Any

from streams import learned
from tasks.countdown_check import CREDIT_CLOSE, CREDIT_FORMAT, CREDIT_NUMBERS, CREDIT_PARSES, PAPER_FORMAT, PARTS
from tasks.prompts import task_format
from trainer.config import with_preset
from weights.model import DEFAULT_MODEL_NAME

ETA_WINDOW = 5  # the newest update intervals the ETA averages (a run speeds up once its caches are warm)
# The ES-at-scale paper's Countdown budget (Qiu et al. 2025, "Evolution Strategies at Scale", arXiv 2509.24372):
# population 30, every member on all 200 problems of an iteration, 500 iterations: 3,000,000 generations. An ES
# run's samples are said against it, so a flat curve at a small budget reads as what it is.
PAPER_POPULATION, PAPER_PROBLEMS, PAPER_ITERATIONS = 30, 200, 500
PAPER_SAMPLES = PAPER_POPULATION * PAPER_PROBLEMS * PAPER_ITERATIONS


def model_name(settings: dict[str, Any]) -> str:
    return settings.get("model") or f"{DEFAULT_MODEL_NAME} (default)"


def reading(task: str | None, reward: str | None = None) -> str | None:
    """How to read the reward and exact figures of `task` (Countdown: under its `reward` scheme, shaped unless
    named), so nobody takes shaped credit for solved problems; None for a task this does not know (a run whose
    settings were not kept says nothing rather than another task's reading)."""
    if task == "countdown" and reward == "paper":
        return (
            f"Countdown's reward is the paper's (TinyZero's; Qiu et al. 2025): {PAPER_FORMAT:g} for an answer in "
            "<answer> tags, 1 solved, nothing between; the credit by part says what else the answers have; exact "
            "counts solved problems only"
        )
    if task == "countdown":
        # An untagged expression earns CREDIT_PARSES without CREDIT_FORMAT: the base model's copy of the prompt's
        # example, "1 + 2 = 3", is the 0.1 most ES runs climb to, not the tag format (docs/EXPERIMENTS.md).
        top = CREDIT_FORMAT + CREDIT_PARSES + CREDIT_NUMBERS + CREDIT_CLOSE
        return (
            f"Countdown's reward is shaped credit: <answer> tags {CREDIT_FORMAT:g}, plus {CREDIT_PARSES:g} for an "
            f"expression, {CREDIT_NUMBERS:g} more for the right numbers, up to {CREDIT_CLOSE:g} more close to "
            f"the target (at most {top:g}), 1 solved; so {CREDIT_FORMAT:g} is the tags alone or an expression "
            "without them; exact counts solved problems only"
        )
    if task == "lean":
        return "a Lean proof earns 1 when Lean accepts it and 0 otherwise: reward and exact are the same measure"
    return None


def prompt_format(settings: dict[str, Any]) -> str | None:
    """The prompt format the run's task was asked in: its `prompt_format` setting as applied to the task
    (tasks/prompts.py `task_format`: the default, `kimina`, is Countdown's `tinyzero`); None where the
    settings name no task or format."""
    task, fmt = settings.get("task"), settings.get("prompt_format")
    if not task or not fmt:
        return None
    try:
        return task_format(task, fmt)
    except ValueError:  # a format or task of another build: shown as recorded
        return fmt


def main_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that shape what a run learns, with the ES preset's values filled in."""
    shared = {
        k: settings.get(k)
        for k in ("iterations", "seed", "held_out", "max_new_tokens", "eval_every", "quorum", "max_staleness")
    }
    if settings.get("algo", "es") == "es":
        filled = with_preset(settings)  # a run.json from before the settings held the preset's values has None
        own = {
            k: filled.get(k)
            for k in ("preset", "population", "sigma", "alpha", "batch", "antithetic", "es_temperature")
        }
        own["es_noise"] = filled.get("es_noise") or "full"  # a run.json from before low-rank ES: full
        if own["es_noise"] == "lowrank":
            own["es_rank"] = filled.get("es_rank")
    else:
        own = {
            k: settings.get(k)
            for k in ("group_size", "batch", "lr", "temperature", "advantage", "kl_coef", "train_precision")
        }
    if settings.get("task", "countdown") == "countdown":  # a run from before the setting was shaped
        shared["reward"] = settings.get("reward") or "shaped"
    return {**own, **shared, "prompt_format": prompt_format(settings)}


def budget(samples: int) -> dict[str, Any]:
    """An ES run's training samples against the paper's (`PAPER_SAMPLES`), with the words `ops run` and the
    dashboard say it in: `1,024 samples: 0.034% of the paper's 3M (population 30 x 200 problems x 500
    iterations)`."""
    share = samples / PAPER_SAMPLES
    pct = share * 100
    shown = f"{pct:.0f}%" if pct >= 10 else f"{pct:.2g}%"
    words = (
        f"{samples:,} samples: {shown} of the paper's {PAPER_SAMPLES / 1e6:g}M (population {PAPER_POPULATION} x "
        f"{PAPER_PROBLEMS} problems x {PAPER_ITERATIONS} iterations, Qiu et al. 2025)"
    )
    return {"samples": samples, "paper_samples": PAPER_SAMPLES, "share": round(share, 8), "words": words}


def spread(update: dict[str, Any] | None) -> dict[str, Any] | None:
    """How the members of an ES run's last update differed (its metrics' `member_spread`, trainer/es.py), with
    its words: all alike is a step of zeros (the z-scores of equal rewards), which no curve shows. None for a
    record without it (GRPO, or an ES run from before it was kept)."""
    figures = (update or {}).get("member_spread")
    if not isinstance(figures, dict) or not figures.get("members"):
        return None
    n, distinct, lo, hi = figures["members"], figures["distinct"], figures["min"], figures["max"]
    at = f"last update (v{update['version']})" if "version" in (update or {}) else "last update"
    if distinct <= 1:
        words = f"{at}: all {n} members scored {lo:.3f}: no reward difference, so a step of zeros"
    else:
        words = (
            f"{at}: {figures['differed']} of {n} members' rewards differed from the most common "
            f"({figures['mode']:.3f}); {distinct} distinct, {lo:.3f} to {hi:.3f}"
        )
    return {**figures, "words": words}


def parts_words(first: dict[str, float] | None, last: dict[str, float] | None = None) -> str:
    """Credit by part in words: `format 0.91, expression 0.50, ...`, or first -> last: `format 0.91 -> 0.97`."""
    names = [k for k in PARTS if k in (last or first or {})]
    names += [k for k in (last or first or {}) if k not in PARTS]
    if last is None:
        return ", ".join(f"{k} {first[k]:.3f}" for k in names)
    return ", ".join(f"{k} {(first or {}).get(k, 0.0):.3f} -> {last[k]:.3f}" for k in names)


def by_part(evals: dict[Any, dict[str, Any]], update: dict[str, Any] | None) -> dict[str, Any] | None:
    """Countdown's credit by part: held-out at the first and last evaluation that has it, and training over the
    attempts of the last update; each with its words. None where neither has it (Lean, older runs)."""
    with_parts = sorted((int(v), e["held_out_parts"]) for v, e in evals.items() if e.get("held_out_parts"))
    train = (update or {}).get("parts") or None
    if not with_parts and not train:
        return None
    out: dict[str, Any] = {"held_out": None, "training": None}
    if with_parts:
        (v0, first), (v1, last) = with_parts[0], with_parts[-1]
        shown = parts_words(first, last) if v1 != v0 else parts_words(last)
        span = f"v{v0} -> v{v1}" if v1 != v0 else f"v{v1}"
        out["held_out"] = {"first_version": v0, "first": first, "last_version": v1, "last": last}
        out["held_out_words"] = f"held-out by part ({span}): {shown}"
    if train:
        out["training"] = {"version": update.get("version"), "parts": train}
        out["training_words"] = f"training by part (v{update.get('version')}): {parts_words(train)}"
    return out


def held_out(evals: dict[Any, dict[str, Any]]) -> dict[str, Any] | None:
    """The evaluations' first, last and best point (best: the highest reward, the latest of equals, so a run
    that ends at its best says no more than its last), each with the problems solved exactly; None before
    the first evaluation."""
    points = []
    for version, e in sorted(evals.items(), key=lambda kv: int(kv[0])):
        problems = int(e.get("problems") or 0)
        points.append(
            {
                "version": int(version),
                "reward": e["held_out_reward"],
                "exact": e["held_out_exact"],
                "solved": round(e["held_out_exact"] * problems),
                "problems": problems,
            }
        )
    if not points:
        return None
    best = max(points, key=lambda p: (p["reward"], p["version"]))
    return {"first": points[0], "last": points[-1], "best": best, "evaluations": len(points)}


def eta_s(
    version: int,
    iterations: int,
    update_times: list[float],
    started: float | None,
    now: float,
    eval_s: float | None = None,
    ends_at: float | None = None,
) -> float | None:
    """Seconds until the run ends: the versions left at the mean interval of the newest updates (the first
    interval counts from the trainer's start), less the time since the last one, plus `eval_s` for the final
    evaluation (the newest evaluation's time from issue to landing). `ends_at`: when a wall-clock budget
    (`max_minutes`) runs out; the versions then end at most one version after it (the one under way is
    finished), as trainer/console.py says too. None before any update."""
    left = iterations - version
    if left <= 0:
        return eval_s or 0.0
    times = sorted(update_times)[-(ETA_WINDOW + 1) :]
    if len(times) < 2:
        if not times or started is None or times[0] <= started:
            return None
        times = [started, *times]
    per_version = (times[-1] - times[0]) / (len(times) - 1)
    versions_s = within_budget(max(0.0, per_version * left - (now - times[-1])), per_version, now, ends_at)
    return versions_s + (eval_s or 0.0)


def within_budget(versions_s: float, per_version: float, now: float, ends_at: float | None) -> float:
    """The seconds the versions left take, under a wall-clock budget that runs out at `ends_at` (None: no
    budget): at most what is left of it and one version, the one under way when it runs out (trainer/loop.py
    finishes it). The trainer's console and its result say the same ETA by this one rule."""
    return versions_s if ends_at is None else min(versions_s, max(0.0, ends_at - now) + per_version)


def summary(
    settings: dict[str, Any],
    *,
    version: int | None,
    counts: dict[str, Any],
    evals: dict[Any, dict],
    status: str,
    started: float | None = None,
    wall_s: float | None = None,
    update_times: list[float] = (),
    now: float | None = None,
    eval_s: float | None = None,
    answers: list[str] = (),
    prompt: dict[str, Any] | None = None,
    last_update: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result. `status`: live, finished, interrupted (stopped before its last version). `wall_s`: the
    trainer's own measure once it ended, else the time since `started`. `evals` with their per-problem figures
    (streams/learned.py `with_problems`) give the verdict with its noise; `answers`: what the answers were at
    the first and last evaluation (`learned.answers`); `eval_s`: an evaluation's time, for the ETA; `prompt`:
    the prompt the run recorded (tasks/prompts.py `applied`), else its format from the settings; `last_update`:
    the metrics of its newest version, for the credit by part in training and an ES update's member spread.
    An ES run's samples are also said against the paper's budget (`budget`)."""
    now = time.time() if now is None else now
    iterations = int(settings.get("iterations") or 0)
    live = status == "live"
    if wall_s is None and started is not None and live:
        wall_s = now - started
    minutes = float(settings.get("max_minutes") or 0)
    ends_at = started + 60 * minutes if minutes and started is not None else None
    eta = eta_s(version or 0, iterations, list(update_times), started, now, eval_s, ends_at) if live else None
    return {
        "run": settings.get("run"),
        "algo": settings.get("algo"),
        "task": settings.get("task"),
        "model": model_name(settings),
        "status": status,
        "version": version,
        "iterations": iterations,
        "max_minutes": minutes or None,
        "samples": int(counts.get("samples") or 0),
        "budget": budget(int(counts.get("samples") or 0)) if settings.get("algo", "es") == "es" else None,
        "spread": spread(last_update),
        "by_part": by_part(evals, last_update),
        "held_out": held_out(evals),
        "verdict": learned.verdict(evals),
        "answers": list(answers),
        "wall_s": wall_s,
        "started": started,
        "ended": started + wall_s if started is not None and wall_s is not None and not live else None,
        "eta_s": eta,
        "settings": main_settings(settings),
        "prompt": prompt or {"format": prompt_format(settings)},
        "reading": reading(settings.get("task"), settings.get("reward")),
    }


def duration(seconds: float | None) -> str:
    """The project's one way to say how long: `350 ms`, `41 s`, `6 min 37 s`, `2 h 05 min`; `-` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def evaluation_line(h: dict[str, Any]) -> str:
    """`reward 0.075 (v0) -> 0.212 (v2), best 0.212 (v2); exact 0/8 -> 1/8, best 1/8`."""
    first, last, best = h["first"], h["last"], h["best"]
    line = f"held-out reward {first['reward']:.3f} (v{first['version']}) -> {last['reward']:.3f} (v{last['version']})"
    if best["version"] not in (first["version"], last["version"]):
        line += f", best {best['reward']:.3f} (v{best['version']})"
    line += f"; exact {first['solved']}/{first['problems']} -> {last['solved']}/{last['problems']}"
    return line + (f", best {best['solved']}/{best['problems']}" if best["solved"] > last["solved"] else "")


def progress(r: dict[str, Any], short: bool = False) -> str:
    """How far a run is: `version 3 of 8`; under a wall-clock budget the version count is a cap the budget
    reaches first, so `version 3 of a 45 min budget`. `short`: a table cell, `3/8` or `3 (45 min)`."""
    if r.get("max_minutes"):
        budget = f"{r['max_minutes']:g} min"
        return f"{r['version']} ({budget})" if short else f"version {r['version']} of a {budget} budget"
    return f"{r['version']}/{r['iterations']}" if short else f"version {r['version']} of {r['iterations']}"


def headline(r: dict[str, Any]) -> str:
    """The result in one line: the trainer's end line, `ops run`'s first."""
    algo = {"es": "ES", "grpo": "GRPO"}.get(r["algo"], r["algo"])
    state = {"live": "at", "finished": "finished at", "interrupted": "stopped at"}.get(r["status"], "at")
    line = f"run {r['run']!r} {state} {progress(r)}"
    line += f" ({algo} on {r['task']}, {r['model']}"
    line += f", {duration(r['wall_s'])}" if r["wall_s"] is not None else ""
    line += f", ETA {duration(r['eta_s'])})" if r["eta_s"] is not None else ")"
    if r["held_out"]:
        line += "; " + evaluation_line(r["held_out"])
    return line + f"; {r['samples']} training samples"

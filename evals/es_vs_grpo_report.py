"""What `python -m evals.es_vs_grpo` writes: per seed (`OUT/seed<K>/compare.{md,json,png}`) the runs' curves,
their figures side by side, the settings and the commands; over the seeds (`OUT/compare.{md,json,png}`) the
mean and spread of each algorithm's figures and a plot of the mean curves with their min-max band. How to read
them, and why the settings are what they are: docs/EXPERIMENTS.md (GUIDE).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import orjson

from evals import plots
from evals.runner import endpoints
from streams.run_dir import read_records, update_records
from trainer.config import PRESETS
from trainer.curves import plot_runs
from trainer.plots import pyplot
from trainer.result import duration

GUIDE = 'docs/EXPERIMENTS.md, "Reading an ES-against-GRPO comparison"'
LABELS = {"es": "ES", "grpo": "GRPO", "es-lowrank": "ES low-rank"}
COLORS = {"es": "tab:blue", "grpo": "tab:orange", "es-lowrank": "tab:green"}
FILES = ("compare.json", "compare.md", "compare.png")  # a seed's in OUT/seed<K>/, the summary's in OUT/
FIGURES = ("reward_end", "gain", "exact_end", "proved_per_version", "wall_s", "samples_per_s")


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _short(arg: str) -> str:
    return "python" if arg == sys.executable else arg


# -- one seed --------------------------------------------------------------------------------------------


def budget_words(doc: dict[str, Any]) -> str:
    """What each algorithm was given: `1024 training samples` or `45 minutes of wall-clock`."""
    if doc.get("wall_clock_min") is not None:
        return f"{doc['wall_clock_min']:g} minutes of wall-clock"
    return f"{doc['budget']} training samples"


def markdown(result: dict[str, Any]) -> str:
    s, algos = result["settings"], result["algos"]
    lines = [f"# ES vs GRPO on {s['task']}: {budget_words(result)} each", ""]
    lines += [
        f"Held-out reward (shaped) and exact success, greedy on the same {s['held_out']} held-out problems, "
        f"against the training samples the updates used and the wall time since the trainer started "
        f"(start-up included); reading it: {GUIDE}.",
        "",
        "| algo | version | training samples | wall (min) | held-out reward | held-out exact |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for algo, r in algos.items():
        for pt in r["curve"]:
            samples = pt["samples"] if pt["samples"] is not None else "-"
            wall = _fmt(pt["wall_s"] / 60, 1) if pt.get("wall_s") is not None else "-"
            lines.append(
                f"| {LABELS[algo]} | {pt['version']} | {samples} | {wall} | {_fmt(pt['held_out_reward'])} | "
                f"{_fmt(pt['held_out_exact'])} |"
            )
    lines += [
        "",
        "| algo | engine | samples / version | versions | samples used | generated for training | samples / s | "
        "held-out reward start -> end | held-out exact start -> end | wall time |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for algo, r in algos.items():
        ends = endpoints(r["curve"])
        failed = "" if r["returncode"] == 0 else f" (exit {r['returncode']})"
        rate = algo_figures(r, with_records=False)["samples_per_s"]
        engine = f"{r.get('engine') or s.get('engine', 'auto')} {r.get('gen_dtype') or s['gen_dtype']}"
        lines.append(
            f"| {LABELS[algo]} | {engine} | {r['plan']['samples_per_version']} | {r['versions']} | "
            f"{r['samples_used']} | "
            f"{r['generated_for_training'] if r['generated_for_training'] is not None else '-'} | {_fmt(rate, 2)} | "
            f"{_fmt(ends['reward_start'])} -> {_fmt(ends['reward_end'])} | "
            f"{_fmt(ends['exact_start'])} -> {_fmt(ends['exact_end'])} | {duration(r['wall_s'])}{failed} |"
        )
    lines += ["", "## Settings", ""]
    lines += [f"- {line}" for line in settings_lines(result)]
    lines += ["", "## Commands", ""]
    for algo, r in algos.items():
        log = Path(r["run_dir"]).parent / f"{algo}.log"
        lines += [f"{LABELS[algo]} (log: `{log}`):", "", "```", " ".join(_short(a) for a in r["command"]), "```", ""]
    lines += [f"Total wall time: {duration(result['wall_s'])}.", ""]
    return "\n".join(lines)


def settings_lines(result: dict[str, Any]) -> list[str]:
    """The settings of the seed's runs, each with the flag that sets it; why they are what they are: GUIDE."""
    s = result["settings"]
    es, grpo = result["algos"].get("es"), result["algos"].get("grpo")
    if result.get("wall_clock_min") is not None:
        m = result["wall_clock_min"]
        budget = (
            f"budget: {m:g} minutes of wall-clock per algorithm (`--wall-clock`), from each trainer's start, start-up "
            "and evaluations included; each run finishes the version under way when it runs out, then its final "
            f"evaluation (`python -m trainer --max-minutes`); evaluations every {m / s['eval_points']:g} minutes "
            "(`--eval-points`)"
        )
    else:
        budget = f"budget: {result['budget']} training samples per algorithm (`--budget`); evaluation not counted"
    own_engines = result.get("wall_clock_min") is not None  # each algorithm on its own engine (the lines below)
    out = [
        budget,
        f"same for both: task {s['task']}, seed {s['seed']} (same {s['problems']} training problems and held-out "
        f"split), GRPO's sampling temperature {s['temperature']} (ES members: `es_temperature`, greedy unless "
        f"passed), max_new_tokens {s['max_new_tokens']}, held-out problems {s['held_out']}, base model "
        f"{s['model']}" + ("" if own_engines else f", engine {s['engine']}"),
    ]
    if not own_engines:
        out.append(f"generator precision: {s['gen_dtype']} (`--gen-dtype`; the GRPO trainer computes in float32)")
    for algo, r in result["algos"].items():
        if r.get("plan", {}).get("minutes") is not None:
            out.append(
                f"{LABELS[algo]} ran on the {r.get('engine')} engine, generator in {r.get('gen_dtype')}: "
                f"{r.get('engine_why')}"
            )
    out += [
        f"evaluations: version 0, every iterations // {s['eval_points']} versions, and the last (`--eval-points`)"
        if result.get("wall_clock_min") is None
        else "evaluations: each run's own generator (engine and precision above), so version 0 may differ by "
        "their numerics",
        f"quorum {s['quorum']} for both (`--quorum`), max_staleness {s.get('max_staleness', 1)}",
    ]
    if es:
        p, cpu = es["plan"], PRESETS["cpu"]
        sigma = s["es_sigma"] or f"preset cpu ({cpu['sigma']})"
        alpha = s["es_alpha"] or f"preset cpu ({cpu['alpha']})"
        out.append(
            f"ES: population {s['es_population']} (`--es-population`) x batch {s['es_batch']} (`--es-batch`) = "
            f"{p['samples_per_version']} samples a version, {_versions(p)}; sigma {sigma}, alpha {alpha}"
        )
    if grpo:
        p = grpo["plan"]
        out.append(
            f"GRPO: batch {s['grpo_batch']} theorems (`--grpo-batch`) x group size {s['grpo_group_size']} "
            f"(`--grpo-group-size`) = {p['samples_per_version']} samples a version, {_versions(p)}; "
            f"learning rate {s['grpo_lr']} (`--grpo-lr`)"
        )
    if result.get("extra"):
        out.append(f"passed to both trainers unchanged: `{' '.join(result['extra'])}`")
    out.append(f"what these settings mean and why: {GUIDE}")
    return out


def _versions(p: dict[str, Any]) -> str:
    if p.get("minutes") is not None:
        return f"versions until the {p['minutes']:g} minutes run out"
    return f"{p['iterations']} version(s)"


def plot(result: dict[str, Any], path: Path) -> Path | None:
    """Held-out reward (solid) and exact success (dashed) against training samples and against wall time, a
    colour per algorithm: trainer/curves.py's plot, the one `python -m ops compare` draws."""
    runs = [{"label": LABELS[algo], "color": COLORS[algo], "curve": r["curve"]} for algo, r in result["algos"].items()]
    title = (
        f"ES vs GRPO, {result['settings']['task']}, {budget_words(result)} each, greedy on "
        f"{result['settings']['held_out']} held-out"
    )
    return plot_runs(runs, path, title, budget=result["budget"], minutes=result.get("wall_clock_min"))


def write(result: dict[str, Any], out: Path) -> None:
    """A seed's result: compare.json, compare.md, compare.png in `out`."""
    as_json, as_md, as_png = FILES
    (out / as_json).write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    (out / as_md).write_text(markdown(result))
    plot(result, out / as_png)


# -- over seeds -------------------------------------------------------------------------------------------


def proved_per_version(records: list[dict[str, Any]]) -> float | None:
    """Training attempts judged `proved` per update (pass rate x attempts of each version), averaged."""
    updates = [r for r in update_records(records) if "pass_rate" in r]
    if not updates:
        return None
    return statistics.fmean(float(r["pass_rate"]) * int(r.get("attempts", 0)) for r in updates)


def algo_figures(r: dict[str, Any], with_records: bool = True) -> dict[str, Any]:
    """One algorithm's figures on one seed (from its result and, `with_records`, its run's metrics)."""
    ends = endpoints(r["curve"])
    wall = r.get("trainer_wall_s") or r["wall_s"]
    return {
        "reward_end": ends["reward_end"],
        "gain": ends["gain"],
        "exact_end": ends["exact_end"],
        "proved_per_version": proved_per_version(read_records(Path(r["run_dir"]))) if with_records else None,
        "wall_s": wall,
        "samples_per_s": (r["samples_used"] / wall) if wall and r["samples_used"] is not None else None,
        "returncode": r["returncode"],
    }


def _stats(values: list[float | None]) -> dict[str, float | int | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {"mean": statistics.fmean(xs), "std": std, "min": min(xs), "max": max(xs), "n": len(xs)}


def summarize(
    results: dict[int, dict[str, Any]],
    algos: list[str],
    seeds: list[int],
    budget: int | None,
    wall_clock_min: float | None = None,
) -> dict[str, Any]:
    """Every seed's figures, and per algorithm their mean and spread over the seeds whose run finished."""
    per_seed = {seed: {algo: algo_figures(r) for algo, r in res["algos"].items()} for seed, res in results.items()}
    over: dict[str, Any] = {}
    for algo in dict.fromkeys(algos):
        rows = [figs[algo] for figs in per_seed.values() if algo in figs and figs[algo]["returncode"] == 0]
        over[algo] = {key: _stats([row[key] for row in rows]) for key in FIGURES}
    ok = all(res["ok"] for res in results.values()) and len(results) == len(seeds)
    return {
        "budget": budget,
        "wall_clock_min": wall_clock_min,
        "seeds": list(results),
        "per_seed": per_seed,
        "algos": over,
        "ok": ok,
        "results": results,
    }


def _ms(st: dict[str, Any], digits: int = 3) -> str:
    if st["mean"] is None:
        return "-"
    return f"{st['mean']:.{digits}f} ± {st['std']:.{digits}f} (n={st['n']})"


def summary_markdown(summary: dict[str, Any]) -> str:
    lines = [
        f"# ES vs GRPO: {budget_words(summary)} each, seeds {summary['seeds']}",
        "",
        "Mean ± sample standard deviation over the seeds whose run finished; gain = end - version 0 of the same "
        f"seed; reading it: {GUIDE}. Per seed: `seed<K>/compare.md`.",
        "",
        "| algo | held-out reward (end) | gain | held-out exact (end) | proved per version | wall (s) | "
        "training samples / s |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo, st in summary["algos"].items():
        lines.append(
            f"| {LABELS[algo]} | {_ms(st['reward_end'])} | {_ms(st['gain'])} | {_ms(st['exact_end'])} | "
            f"{_ms(st['proved_per_version'], 2)} | {_ms(st['wall_s'], 0)} | {_ms(st['samples_per_s'], 2)} |"
        )
    lines += ["", "| seed | algo | reward end | gain | exact end | exit |", "|---:|---|---:|---:|---:|---:|"]
    for seed, figs in summary["per_seed"].items():
        for algo, f in figs.items():
            lines.append(
                f"| {seed} | {LABELS[algo]} | {_fmt(f['reward_end'])} | {_fmt(f['gain'])} | "
                f"{_fmt(f['exact_end'])} | {f['returncode']} |"
            )
    return "\n".join(lines) + "\n"


def summary_plot(summary: dict[str, Any], path: Path) -> Path | None:
    if (plt := pyplot()) is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for algo in summary["algos"]:
        runs = [res["algos"][algo] for res in summary["results"].values() if algo in res["algos"]]
        curves = [r["curve"] for r in runs if r["curve"]]
        if curves:
            plots.mean_band(ax, curves, f"{LABELS[algo]} held-out reward, mean of {len(curves)} seed(s)", COLORS[algo])
    return plots.finish(fig, ax, path, "ES vs GRPO over seeds (band: min-max)", "held-out reward (shaped, greedy)")


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """The comparison over seeds: compare.json (without the seeds' whole results), compare.md, compare.png."""
    as_json, as_md, as_png = FILES
    doc = {k: v for k, v in summary.items() if k != "results"}
    (out / as_json).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    (out / as_md).write_text(summary_markdown(summary))
    summary_plot(summary, out / as_png)


def summary_line(summary: dict[str, Any]) -> dict[str, Any]:
    """The command's last line of output: per algorithm its mean figures and how many seeds finished."""
    line: dict[str, Any] = {"budget": summary["budget"], "seeds": summary["seeds"], "ok": summary["ok"]}
    if summary.get("wall_clock_min") is not None:
        line["wall_clock_min"] = summary["wall_clock_min"]
    for algo, st in summary["algos"].items():
        line[algo] = {key: st[key]["mean"] for key in ("reward_end", "gain", "exact_end", "wall_s", "samples_per_s")}
        line[algo]["n"] = st["reward_end"]["n"]
    return line

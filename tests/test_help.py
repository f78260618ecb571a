"""Every command's `--help` tells the truth: each settings flag's default there is the value the command runs
with when the flag is not given (the settings objects loaded with nothing set, the evaluation's own options),
each names its PROOFSTREAM_* variable and TOML key, every flag has help, and a command offers only its own
flags (pass@k and ops none of the trainer's training flags)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from evals import passk
from ops.cli import NOT_OPS, OpsSettings
from ops.cli import build_parser as ops_parser
from producers.__main__ import build_parser as producers_parser
from producers.config import GeneratorSettings
from streams.settings import shown_default
from trainer.__main__ import build_parser as trainer_parser
from trainer.config import TrainerSettings
from trainer.es import es_config
from weights.model import DEFAULT_MODEL_NAME


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """dest -> help (as printed: argparse's %% undone) of every optional flag, subcommands' included."""
    out, todo = {}, [parser]
    while todo:
        p = todo.pop()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += list(a.choices.values())
            elif a.option_strings and a.dest != "help":
                out[a.dest] = (a.help or "").replace("%%", "%")
    return out


def default_in(help_text: str) -> str:
    """The default a help text names: what follows its last `; default ` up to the `[PROOFSTREAM_...]` bracket
    (the run's default, the word "default", is quoted there so that it never reads "default default")."""
    found = re.search(r"; default ((?:(?!; default ).)*?) \[PROOFSTREAM_", help_text)
    assert found, help_text
    return "default" if found.group(1) == "'default'" else found.group(1)


def test_the_trainers_help_shows_the_defaults_it_runs_with():
    shown = flags(trainer_parser())
    loaded = TrainerSettings.load(env={})  # nothing set: what a bare `python -m trainer` runs with
    es = es_config(loaded)
    decided_elsewhere = {
        "population",
        "sigma",
        "alpha",
        "antithetic",
        "reward",
        "batch",
        "run_dir",
        "model",
        "redis_url",
        "settle_replicas",
    }
    for name in TrainerSettings.model_fields:
        text = shown[name]
        assert f"[PROOFSTREAM_{name.upper()}, TOML " in text and text.split(";")[0].strip(), name
        if name not in decided_elsewhere:
            assert default_in(text) == shown_default(getattr(loaded, name)), name
    # The preset's values, as the ES run takes them (cpu is the default preset), and GRPO's batch.
    assert f"cpu {es.population}" in default_in(shown["population"]) and es.population == 8
    assert f"cpu {es.alpha}" in default_in(shown["alpha"]) and f"cpu {es.sigma}" in default_in(shown["sigma"])
    assert f"cpu {shown_default(loaded.antithetic)}" in default_in(shown["antithetic"])
    assert (
        default_in(shown["reward"]) == f"the preset's (paper paper, cpu {loaded.reward})" and loaded.reward == "shaped"
    )
    grpo = TrainerSettings.load(env={}, flags={"algo": "grpo"})
    assert default_in(shown["batch"]) == f"ES: the preset's (paper 200, cpu {loaded.batch}); GRPO: {grpo.batch}"
    assert loaded.directory() == Path("runs/default") and default_in(shown["run_dir"]) == "runs/<run>"
    assert default_in(shown["model"]).startswith(DEFAULT_MODEL_NAME) and loaded.model is None
    assert loaded.redis_url is None and default_in(shown["redis_url"]).startswith("unset: this machine runs")


def test_passk_offers_its_own_flags_with_the_defaults_it_uses():
    parser = passk._parser()
    shown = flags(parser)
    trainer_flags = {d for d, text in shown.items() if "[PROOFSTREAM_" in text} - {"config"}  # settings flags
    assert trainer_flags == set(passk.EVAL_FLAGS)
    assert not {"train_precision", "dist_timeout_s", "iterations", "lr", "population"} & set(shown)
    assert all(text for text in shown.values())
    opts = passk._options(parser.parse_args(["--version", "3"]))
    assert shown["temperature"].endswith(f"default {opts.temperature}") and opts.temperature == 1.0
    assert "PROOFSTREAM_TEMPERATURE" not in shown["temperature"]  # the eval's own option: no variable feeds it
    assert shown["eval_samples"].endswith(f"default {opts.samples}") and opts.samples == 8
    assert shown["eval_seed"].endswith(f"default {opts.sample_seed}")
    assert default_in(shown["max_new_tokens"]) == "the run's"  # from its report.json, not the trainer's 96
    assert default_in(shown["log_level"]) == passk.LOG_LEVEL


def test_ops_offers_no_trainer_or_settle_flags_and_its_own_defaults():
    shown = flags(ops_parser())
    settings_flags = {d for d, text in shown.items() if "[PROOFSTREAM_" in text} - {"config"}
    assert settings_flags == set(OpsSettings.model_fields) - set(NOT_OPS) == {"run", "redis_url", "timeout_s"}
    loaded = OpsSettings.load(env={})
    for name in settings_flags:
        assert default_in(shown[name]) == shown_default(getattr(loaded, name)), name
    assert all(text for dest, text in shown.items()), [d for d, t in shown.items() if not t]


def test_the_generators_help_shows_its_defaults():
    shown = flags(producers_parser())
    loaded = GeneratorSettings.load(env={})
    own_words = {"model", "model_cache", "name", "snapshot_dir", "redis_url", "settle_replicas"}
    for name in GeneratorSettings.model_fields:
        assert f"[PROOFSTREAM_{name.upper()}, TOML " in shown[name]
        if name not in own_words:
            assert default_in(shown[name]) == shown_default(getattr(loaded, name)), name


def test_the_evaluation_commands_say_each_flags_default():
    """evals.es_vs_grpo, evals.sweep and evals.members have their own flags (not settings): each has help, and
    each that has a value by default says it (argparse's `(default: X)`, or the help's own words)."""
    from evals import es_vs_grpo, members, sweep

    for parser in (es_vs_grpo.parser(), sweep.parser(), members.parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (parser.prog, action.dest)
            if action.default not in (None, False, "", argparse.SUPPRESS) and "default" not in action.help:
                assert f"(default: {action.default})" in text, (parser.prog, action.dest)
    assert "--es-population ES_POPULATION ES members a version (default: the cpu preset's, 8)" in " ".join(
        es_vs_grpo.parser().format_help().split()
    )

"""Settings layers: defaults < TOML < PROOFSTREAM_* env < flags; unknown keys and bad values fail clearly."""

from __future__ import annotations

import argparse
import os

import pytest

from streams.settings import RoleSettings, SettingsError


class VerifierLike(RoleSettings):
    section = "verifier"
    concurrency: int = 2
    timeout_s: float = 60.0
    sandbox: str = "process"
    warm: bool = True
    tasks: list[str] = ["countdown"]


def write(tmp_path, text: str):
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_each_layer_overrides_the_one_below(tmp_path):
    cfg = write(tmp_path, 'run = "r1"\n[verifier]\nconcurrency = 8\ntimeout_s = 30\nsandbox = "docker"\n')
    env = {"PROOFSTREAM_TIMEOUT_S": "45.5", "PROOFSTREAM_SANDBOX": "kimina"}
    s = VerifierLike.load(config_path=cfg, env=env, flags={"sandbox": "docker"})
    assert (s.run, s.concurrency, s.timeout_s, s.sandbox, s.warm) == ("r1", 8, 45.5, "docker", True)
    assert VerifierLike.load(env={}).concurrency == 2


def test_config_path_from_env(tmp_path):
    cfg = write(tmp_path, "[verifier]\nconcurrency = 3\n[trainer]\nalgo = 'es'\n")
    assert VerifierLike.load(env={"PROOFSTREAM_CONFIG": str(cfg)}).concurrency == 3


@pytest.mark.parametrize(
    "toml, env, message",
    [
        ("[verifier]\nconcurency = 3\n", {}, "concurency"),
        ("workers = 3\n", {}, "unknown top-level key 'workers'"),
        ("", {"PROOFSTREAM_CONCURRENCY": "many"}, "concurrency"),
        ("[verifier]\nwarm = 'sometimes'\n", {}, "warm"),
        ("[verifier\n", {}, "not valid TOML"),
        ("[verifer]\nconcurrency = 3\n", {}, r"unknown table \[verifer\]"),
    ],
)
def test_bad_configuration_names_the_problem(tmp_path, toml, env, message):
    with pytest.raises(SettingsError, match=message):
        VerifierLike.load(config_path=write(tmp_path, toml), env=env)


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(SettingsError, match="does not exist"):
        VerifierLike.load(config_path=tmp_path / "nope.toml", env={})


def test_flags_override_only_when_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PROOFSTREAM_CONCURRENCY", "5")
    parser = argparse.ArgumentParser()
    VerifierLike.add_arguments(parser)
    assert VerifierLike.from_args(parser.parse_args([])).concurrency == 5
    args = parser.parse_args(["--concurrency", "7", "--no-warm", "--redis-url", "redis://h:1/0"])
    s = VerifierLike.from_args(args)
    assert (s.concurrency, s.warm, s.redis_url) == (7, False, "redis://h:1/0")


def test_every_role_table_is_a_known_table():
    """A role's table must be in SECTIONS, or a file holding it would be refused by every other role."""
    from ops.cli import OpsSettings
    from producers.config import GeneratorSettings
    from streams.settings import SECTIONS
    from trainer.config import TrainerSettings
    from verifier_pool.config import VerifierSettings

    assert {c.section for c in (OpsSettings, GeneratorSettings, TrainerSettings, VerifierSettings)} == set(SECTIONS)


def test_help_names_each_flags_default_choices_variable_and_toml_key():
    from trainer.config import TrainerSettings

    parser = argparse.ArgumentParser()
    TrainerSettings.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    algo = "the algorithm: Evolution Strategies or GRPO; default es [PROOFSTREAM_ALGO, TOML [trainer] algo]"
    assert f"--algo {{es,grpo}} {algo}" in text
    deadline = (
        "an update goes ahead without its quorum after this long (ES: with at least two members); default 900.0 "
        "[PROOFSTREAM_DEADLINE_S, TOML [trainer] deadline_s]"
    )
    assert f"--deadline-s X {deadline}" in text
    assert "default ES: the preset's (paper 200, cpu 16); GRPO: 8 [PROOFSTREAM_BATCH" in text
    assert "--run TEXT, --run-id TEXT the run id" in text and "[PROOFSTREAM_RUN, TOML run (top level)]" in text


def test_flags_are_grouped_under_headings_and_every_trainer_field_has_one():
    from trainer.config import TrainerSettings

    named = [n for fields in TrainerSettings.groups.values() for n in fields]
    assert sorted(named) == sorted(TrainerSettings.model_fields)  # each field under exactly one heading
    parser = argparse.ArgumentParser()
    TrainerSettings.add_arguments(parser)
    headings = {g.title: [a.dest for a in g._group_actions] for g in parser._action_groups}
    es = ["preset", "population", "sigma", "alpha", "antithetic", "es_temperature", "es_noise", "es_rank"]
    assert headings["ES"] == [*es, "members_per_order"]
    assert "--config" in parser.format_help().split("Redis:")[0]  # with the run's own flags, first
    assert "other settings" not in headings  # nothing fell through

    unnamed = argparse.ArgumentParser()
    VerifierLike.add_arguments(unnamed)  # a role without headings: one group, "settings"
    assert {g.title for g in unnamed._action_groups if g._group_actions} >= {"settings"}


def test_every_roles_every_setting_says_what_it_is():
    from ops.cli import OpsSettings
    from producers.config import GeneratorSettings
    from trainer.config import TrainerSettings
    from verifier_pool.config import VerifierSettings

    for cls in (OpsSettings, GeneratorSettings, TrainerSettings, VerifierSettings):
        assert [n for n, info in cls.model_fields.items() if not (info.description or "").strip()] == [], cls


def test_a_setting_two_roles_take_is_declared_once_below_both():
    """The trainer hands the model, the engine, the prompt format and the sandbox's settings to the generators and
    verifiers of its local pipeline: each comes from one declaration, never written again in a role's class."""
    from producers.config import GeneratorSettings
    from streams.role_settings import SandboxSettings
    from tasks.prompts import PromptSettings
    from trainer.config import TrainerSettings
    from verifier_pool.config import VerifierSettings
    from weights.settings import ModelSettings

    takers = {
        SandboxSettings: (VerifierSettings, TrainerSettings),
        ModelSettings: (GeneratorSettings, TrainerSettings),
        PromptSettings: (GeneratorSettings, TrainerSettings),
    }
    for declared, roles in takers.items():
        names = set(declared.model_fields) - set(RoleSettings.model_fields)
        assert names
        for role in roles:
            assert issubclass(role, declared) and not names & set(role.__annotations__), (declared, role)
    for role in (GeneratorSettings, TrainerSettings):  # the formats the tasks define, in the one help text
        assert "Lean kimina, deepseek; Countdown tinyzero, equation" in role.model_fields["prompt_format"].description


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            "[verifier]\nconcurency = 3\n",
            r"run.toml: unknown key 'concurency' in \[verifier\] \(did you mean "
            r"'concurrency'\?\)$",
        ),
        ("[verifer]\nconcurrency = 3\n", r"run.toml: unknown table \[verifer\] \(did you mean \[verifier\]\?\)"),
        ("rn = 'x'\n", r"run.toml: unknown top-level key 'rn' \(did you mean 'run'\?\)"),
        ("[verifier]\nxyzzy = 3\n", r"run.toml: unknown key 'xyzzy' in \[verifier\]$"),  # nothing close: no guess
        ("[verifier]\nconcurrency = 'many'\n", r"concurrency \(from .*run.toml\): Input should be a valid integer"),
    ],
)
def test_a_misspelled_key_names_the_file_and_the_closest_valid_name(tmp_path, toml, message):
    with pytest.raises(SettingsError, match=message) as e:
        VerifierLike.load(config_path=write(tmp_path, toml), env={})
    assert "\n" not in str(e.value)


def test_a_misspelled_flag_is_one_line_with_the_closest_flag(capsys):
    from streams.settings import SettingsParser

    parser = SettingsParser(prog="python -m verifier-like")
    VerifierLike.add_arguments(parser)
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--concurency", "3"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "python -m verifier-like: unknown flag --concurency (did you mean --concurrency?) (see python -m "
        "verifier-like --help)\n"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--zzz"])
    assert (
        capsys.readouterr().err == "python -m verifier-like: unknown flag --zzz (see python -m verifier-like --help)\n"
    )


def test_a_flag_of_another_command_names_the_commands_that_take_it(capsys):
    """Not "did you mean --out?" for --out itself (session 26 saw it): where the flag belongs."""
    from streams.settings import SettingsParser

    parser = SettingsParser(prog="p")
    commands = parser.add_subparsers(dest="command")
    a, b, c = (commands.add_parser(name) for name in "abc")
    a.add_argument("--out")
    b.add_argument("--out")
    c.add_argument("--limit")
    with pytest.raises(SystemExit):
        parser.parse_args(["c", "--out", "f"])
    assert capsys.readouterr().err == "p: unknown flag --out (only p a, p b take it) (see p --help)\n"
    with pytest.raises(SystemExit):
        parser.parse_args(["c", "--outt", "f"])
    assert capsys.readouterr().err == "p: unknown flag --outt (did you mean --out?) (see p --help)\n"


def test_an_invalid_choice_names_the_closest_or_lists_them_all(capsys):
    from streams.settings import SettingsParser

    parser = SettingsParser(prog="p")
    parser.add_argument("--verdict", choices=["proved", "rejected", "timeout"])
    for given, said in (("rejectd", "(did you mean rejected?)"), ("wrong", "(choose from proved, rejected, timeout)")):
        with pytest.raises(SystemExit):
            parser.parse_args(["--verdict", given])
        assert capsys.readouterr().err == f"p: argument --verdict: invalid choice: '{given}' {said} (see p --help)\n"


def test_a_default_that_is_a_word_of_the_sentence_is_quoted():
    from streams.settings import RoleSettings

    assert "; default 'default' [PROOFSTREAM_RUN" in RoleSettings.flag_help("run")


def test_list_settings_from_env_are_json():
    assert VerifierLike.load(env={"PROOFSTREAM_TASKS": '["lean", "countdown"]'}).tasks == ["lean", "countdown"]
    with pytest.raises(SettingsError, match="PROOFSTREAM_TASKS must be JSON"):
        VerifierLike.load(env={"PROOFSTREAM_TASKS": "lean,countdown"})


def test_list_settings_from_flags_are_json_too():
    parser = argparse.ArgumentParser()
    VerifierLike.add_arguments(parser)
    assert VerifierLike.from_args(parser.parse_args(["--tasks", '["countdown"]'])).tasks == ["countdown"]
    with pytest.raises(SettingsError, match="--tasks must be JSON"):
        VerifierLike.from_args(parser.parse_args(["--tasks", "countdown"]))


def test_a_role_command_gives_its_settings_and_refuses_a_bad_one_with_exit_2(monkeypatch, capsys):
    """`python -m producers` and `python -m trainer` build their command lines this way."""
    for name in [k for k in os.environ if k.startswith("PROOFSTREAM_")]:
        monkeypatch.delenv(name)
    parser = VerifierLike.command_parser("checker", "`python -m checker`: checks.\n\nMore words.", {"sandbox": "X"})
    assert (parser.prog, parser.description) == ("python -m checker", "`python -m checker`: checks.")
    assert "default X" in parser.format_help()
    # the level conftest.py sets, so that logging stays as every other test has it
    settings, args = VerifierLike.from_command(parser, ["--concurrency", "4", "--log-level", "warning"])
    assert (settings.concurrency, settings.sandbox, settings.log_level) == (4, "process", "warning")
    assert args.concurrency == "4"  # the flags as given: the trainer reads some of them again
    with pytest.raises(SystemExit) as refused:
        VerifierLike.from_command(parser, ["--concurrency", "many"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("checker: ")

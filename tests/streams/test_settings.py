"""Settings layers: defaults < TOML < PROOFSTREAM_* env < flags; unknown keys and bad values fail clearly."""

from __future__ import annotations

import argparse

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


def test_help_names_each_flags_default_and_choices():
    from trainer.config import TrainerSettings

    parser = argparse.ArgumentParser()
    TrainerSettings.add_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert "--algo ALGO one of es, grpo; default es" in text
    assert "--deadline-s DEADLINE_S default 900.0" in text
    assert "--group-size GROUP_SIZE G: samples per theorem; default 8" in text
    assert "--batch BATCH theorems per member (ES; default: the preset's) or per step (GRPO; default 8) --" in text


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

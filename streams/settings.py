"""Typed settings for every role, layered: defaults < TOML file < `PROOFSTREAM_*` env < command-line flags.

Each role declares one `RoleSettings` subclass with its fields and defaults. The TOML file holds shared
keys at top level (`run`, `redis_url`, `log_level`) and a table per role (`[verifier]`, `[trainer]`, ...).
Unknown keys fail with a message naming them; so do values of the wrong type, wherever they came from.
Env names are the field names upper-cased: `PROOFSTREAM_REDIS_URL`, `PROOFSTREAM_BATCH_SIZE`.

This lives in `streams/` because every role imports `streams/` and nothing else that is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import tomllib
import typing
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from streams import sentinel

ENV_PREFIX = "PROOFSTREAM_"
CONFIG_ENV = "PROOFSTREAM_CONFIG"
# The role tables a TOML file may hold: a table named otherwise is a typo that would be ignored silently.
SECTIONS = ("trainer", "generator", "verifier", "ops")


# Second spellings of a flag. `--run-id`: under torchrun (`torchrun ... -m trainer --run-id R`) the whole
# command line goes through torchrun's own argparse first, which refuses `--run` as an ambiguous prefix of its
# `--run-path` (Python 3.11 argparse matches prefixes of every optional-looking word, even those meant for the
# script; tests/trainer/test_sharded.py runs every trainer flag through torch.distributed.run's parser).
_ALIASES = {"run": ("--run-id",)}


class SettingsError(ValueError):
    """A configuration the role cannot run with; the message says which key and what to do."""


def _structured(where: str, value: Any, annotation: Any) -> Any:
    """Env values and flags are strings; lists and tables are written as JSON
    (`PROOFSTREAM_LEAN_REPL_CMD='["lake", "env", "repl"]'`, `--lean-repl-cmd '["lake", "env", "repl"]'`)."""
    if typing.get_origin(annotation) not in (list, dict) or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise SettingsError(f'{where} must be JSON for this setting, e.g. \'["a", "b"]\': {e}') from e


def _help(info: Any) -> str:
    """A flag's help: its description, its choices (a Literal) and its default."""
    parts = [info.description] if info.description else []
    choices = [a for a in typing.get_args(info.annotation) if typing.get_origin(info.annotation) is typing.Literal]
    if choices:
        parts.append("one of " + ", ".join(map(str, choices)))
    default = info.get_default(call_default_factory=True)
    if default not in (None, "", []) and "default" not in (info.description or ""):  # else the text says it
        parts.append(f"default {default}")
    return "; ".join(parts)


class RoleSettings(BaseModel):
    """Fields every role shares. Subclasses set `section`, their TOML table name."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    section: ClassVar[str] = ""

    run: str = "default"  # the run id; all of a run's keys share its hash tag
    # None: start a private redis-server (the embedded default). redis:// for one server, redis+sentinel://
    # for the master of a Sentinel service (streams/connect.py).
    redis_url: str | None = None
    log_level: str = "info"
    settle_replicas: int | None = Field(None, ge=0, description=(
        "replicas a settle (and the trainer's checkpoint) waits for with WAIT; default: 1 when the master "
        "has a replica in sync, else 0; 0: never wait"))  # fmt: skip
    settle_wait_ms: int = Field(500, ge=1, description="how long one WAIT may take (ms)")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url and sentinel.is_sentinel(url):
            sentinel.parse(url)  # a ValueError naming what is wrong: the message of the settings error
        return url

    @classmethod
    def load(cls, *, config_path: str | Path | None = None, flags: dict[str, Any] | None = None,
             env: dict[str, str] | None = None) -> Self:  # fmt: skip
        """Merge the layers and validate. `flags` holds only the options the user actually gave."""
        env = os.environ if env is None else env
        merged: dict[str, Any] = {}
        path = config_path or env.get(CONFIG_ENV)
        if path:
            merged.update(cls._from_toml(Path(path)))
        for name, info in cls.model_fields.items():
            value = env.get(ENV_PREFIX + name.upper())
            if value is not None:
                merged[name] = _structured(ENV_PREFIX + name.upper(), value, info.annotation)
        for name, value in (flags or {}).items():
            if value is not None:
                info = cls.model_fields.get(name)
                merged[name] = _structured("--" + name.replace("_", "-"), value, info.annotation if info else None)
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise SettingsError(f"bad {cls.section or 'role'} settings: {problems}") from e

    @classmethod
    def _from_toml(cls, path: Path) -> dict[str, Any]:
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError as e:
            raise SettingsError(f"config file {path} does not exist") from e
        except tomllib.TOMLDecodeError as e:
            raise SettingsError(f"config file {path} is not valid TOML: {e}") from e
        shared = set(RoleSettings.model_fields)
        out: dict[str, Any] = {}
        for key, value in doc.items():
            if isinstance(value, dict):
                if key not in SECTIONS:
                    raise SettingsError(f"{path}: unknown table [{key}]; role tables are {', '.join(SECTIONS)}")
                if key == cls.section:
                    out.update(value)
                continue  # another role's table
            if key not in shared:
                raise SettingsError(
                    f"{path}: unknown top-level key {key!r}; top level takes {sorted(shared)}, "
                    f"role settings go in a table such as [{cls.section or 'verifier'}]"
                )
            out[key] = value
        return out

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
        """One `--flag` per field (but `exclude`), its help naming the default and the choices. Defaults are
        suppressed so only given flags override the lower layers (TOML, env)."""
        for name, info in cls.model_fields.items():
            if name in exclude:
                continue
            flag = "--" + name.replace("_", "-")
            if info.annotation is bool:
                parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction,
                                    default=argparse.SUPPRESS, help=_help(info))  # fmt: skip
            else:
                parser.add_argument(
                    flag, *_ALIASES.get(name, ()), dest=name, default=argparse.SUPPRESS, help=_help(info)
                )
        parser.add_argument("--config", dest="config", default=None, help="TOML file (also $PROOFSTREAM_CONFIG)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        given = {k: v for k, v in vars(args).items() if k in cls.model_fields}
        return cls.load(config_path=getattr(args, "config", None), flags=given)

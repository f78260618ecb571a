"""Typed settings for every role, layered: defaults < TOML file < `PROOFSTREAM_*` env < command-line flags.

Each role declares one `RoleSettings` subclass with its fields and defaults. The TOML file holds shared
keys at top level (`run`, `redis_url`, `log_level`) and a table per role (`[verifier]`, `[trainer]`, ...).
Unknown keys fail with a message naming the file and the closest valid name; so do values of the wrong
type, wherever they came from. Env names are the field names upper-cased: `PROOFSTREAM_REDIS_URL`,
`PROOFSTREAM_BATCH_SIZE`. `--help` shows for each flag its help, its real default, its variable and its key.

This lives in `streams/` because every role imports `streams/` and nothing else that is shared.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from streams import logs, sentinel

ENV_PREFIX = "PROOFSTREAM_"
CONFIG_ENV = "PROOFSTREAM_CONFIG"
# The role tables a TOML file may hold: a table named otherwise is a typo that would be ignored silently.
SECTIONS = ("trainer", "generator", "verifier", "ops")
OTHER_GROUP = "other settings"  # the help group of a field no `groups` entry names


# Second spellings of a flag. `--run-id`: under torchrun (`torchrun ... -m trainer --run-id R`) the whole
# command line goes through torchrun's own argparse first, which refuses `--run` as an ambiguous prefix of its
# `--run-path` (Python 3.11 argparse matches prefixes of every optional-looking word, even those meant for the
# script; tests/trainer/test_sharded.py runs every trainer flag through torch.distributed.run's parser).
_ALIASES = {"run": ("--run-id",)}


class SettingsError(ValueError):
    """A configuration the role cannot run with; the message says which key and what to do."""


def closest(word: str, names: Iterable[str]) -> str | None:
    """The valid name `word` most likely misspells (difflib's ratio over 0.6), or None."""
    found = difflib.get_close_matches(word, list(names), n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(word: str, names: Iterable[str], show: typing.Callable[[str], str] = str) -> str:
    near = closest(word, names)
    return f" (did you mean {show(near)}?)" if near else ""


def _structured(where: str, value: Any, annotation: Any) -> Any:
    """Env values and flags are strings; lists and tables are written as JSON
    (`PROOFSTREAM_LEAN_REPL_CMD='["lake", "env", "repl"]'`, `--lean-repl-cmd '["lake", "env", "repl"]'`)."""
    if typing.get_origin(annotation) not in (list, dict) or not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise SettingsError(f'{where} must be JSON for this setting, e.g. \'["a", "b"]\': {e}') from e


def shown_default(value: Any) -> str:
    """A default as `--help` prints it (and as tests/streams/test_settings.py reads it back)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | dict):
        return json.dumps(value)
    if value == "":
        return '""'
    return str(getattr(value, "value", value))


def _metavar(info: Any) -> str:
    """A short placeholder in place of argparse's upper-cased name (`--max-new-tokens N`, not MAX_NEW_TOKENS)."""
    annotation = info.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return "{" + ",".join(map(str, typing.get_args(annotation))) + "}"
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0]
    if typing.get_origin(kind) in (list, dict):
        return "JSON"
    return {int: "N", float: "X"}.get(kind, "TEXT")


class RoleSettings(BaseModel):
    """Fields every role shares. Subclasses set `section`, their TOML table name, and may set `groups`: help
    headings -> the fields under each, in order (fields no heading names go under OTHER_GROUP)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
    section: ClassVar[str] = ""
    groups: ClassVar[dict[str, tuple[str, ...]]] = {}

    run: str = Field("default", description="the run id: every Redis key of the run carries it ({ps:<run>}:...)")
    redis_url: str | None = Field(
        None,
        description=(
            "the run's Redis: redis:// (one server), redis+sentinel://s1,s2/<service> or redis+cluster://n1,n2 "
            "(streams/connect.py)"
        ),
    )
    log_level: str = Field("info", description="structlog level: debug, info, warning, error")
    settle_replicas: int | None = Field(
        None,
        ge=0,
        description="replicas a settle (and the trainer's checkpoint) waits for with WAIT; 0: never wait",
        json_schema_extra={"default_text": "1 when the master has a replica in sync, else 0"},
    )
    settle_wait_ms: int = Field(500, ge=1, description="how long one WAIT may take (ms)")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url and sentinel.is_sentinel(url):
            sentinel.parse(url)  # a ValueError naming what is wrong: the message of the settings error
        return url

    @classmethod
    def load(
        cls,
        *,
        config_path: str | Path | None = None,
        flags: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> Self:
        """Merge the layers and validate. `flags` holds only the options the user actually gave."""
        env = os.environ if env is None else env
        merged: dict[str, Any] = {}
        came_from: dict[str, str] = {}  # field -> the layer that set it, for the error message
        path = config_path or env.get(CONFIG_ENV)
        if path:
            merged.update(cls._from_toml(Path(path)))
            came_from.update(dict.fromkeys(merged, str(path)))
        for name, info in cls.model_fields.items():
            value = env.get(ENV_PREFIX + name.upper())
            if value is not None:
                merged[name] = _structured(ENV_PREFIX + name.upper(), value, info.annotation)
                came_from[name] = ENV_PREFIX + name.upper()
        for name, value in (flags or {}).items():
            if value is not None:
                info = cls.model_fields.get(name)
                flag = "--" + name.replace("_", "-")
                merged[name] = _structured(flag, value, info.annotation if info else None)
                came_from[name] = flag
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            problems = "; ".join(_problem(err, came_from) for err in e.errors())
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
                    hint = _did_you_mean(key, SECTIONS, lambda t: f"[{t}]")
                    raise SettingsError(f"{path}: unknown table [{key}]{hint}; role tables are {', '.join(SECTIONS)}")
                if key == cls.section:
                    unknown = [k for k in value if k not in cls.model_fields]
                    if unknown:
                        raise SettingsError(
                            f"{path}: unknown key {unknown[0]!r} in [{key}]"
                            f"{_did_you_mean(unknown[0], cls.model_fields, repr)}"
                        )
                    out.update(value)
                continue  # another role's table: that role checks it
            if key not in shared:
                hint = _did_you_mean(key, shared, repr)
                raise SettingsError(
                    f"{path}: unknown top-level key {key!r}{hint}; the top level takes "
                    f"{', '.join(sorted(shared))}, role settings go in a table such as "
                    f"[{cls.section or 'verifier'}]"
                )
            out[key] = value
        return out

    @classmethod
    def default_text(cls, name: str) -> str:
        """What a field's flag defaults to, as `--help` says it: the field's own words where its real default
        is decided elsewhere (a preset, the Redis's replicas), else the default itself."""
        info = cls.model_fields[name]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if "default_text" in extra:
            return str(extra["default_text"])
        return shown_default(info.get_default(call_default_factory=True))

    @classmethod
    def flag_help(cls, name: str, default: str | None = None) -> str:
        """A flag's help: its description, choices, default (`default` for this command, else the field's),
        and where else it can be set: its PROOFSTREAM_* variable and its TOML key."""
        info = cls.model_fields[name]
        parts = [info.description] if info.description else []  # choices: in the metavar, {a,b}
        shown = cls.default_text(name) if default is None else default
        parts.append(f"default {shown!r}" if shown == "default" else f"default {shown}")  # not "default default"
        key = f"{name} (top level)" if name in RoleSettings.model_fields else f"[{cls.section}] {name}"
        text = "; ".join(parts) + f" [{ENV_PREFIX}{name.upper()}, TOML {key}]"
        return text.replace("%", "%%")  # argparse formats help with %

    @classmethod
    def add_arguments(
        cls,
        parser: argparse.ArgumentParser,
        exclude: tuple[str, ...] = (),
        only: tuple[str, ...] | None = None,
        defaults: dict[str, str] | None = None,
    ) -> None:
        """One `--flag` per field (those in `only` when given, less `exclude`), under the class's help groups,
        in the order they list them (the fields a role shares with another are declared with both, elsewhere).
        `defaults`: what a flag defaults to in this command where that is not the field's default (an
        evaluation takes the run's). Defaults are suppressed so only given flags override the lower layers."""
        defaults = defaults or {}
        named = [n for fields in cls.groups.values() for n in fields]  # in the order the headings list them
        names = [n for n in named + list(cls.model_fields) if n not in exclude and (only is None or n in only)]
        names = [n for n in dict.fromkeys(names) if n in cls.model_fields]
        titles = [t for t in cls.groups if any(n in names for n in cls.groups[t])]
        sections = {t: parser.add_argument_group(t) for t in titles}
        where = {n: sections[t] for t in titles for n in cls.groups[t]}
        if any(n not in where for n in names):
            sections[OTHER_GROUP] = parser.add_argument_group(OTHER_GROUP if sections else "settings")
        for name in names:
            group, info = where.get(name) or sections[OTHER_GROUP], cls.model_fields[name]
            flag, text = "--" + name.replace("_", "-"), cls.flag_help(name, defaults.get(name))
            if info.annotation is bool:
                group.add_argument(
                    flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=text
                )
            else:
                group.add_argument(
                    flag,
                    *_ALIASES.get(name, ()),
                    dest=name,
                    default=argparse.SUPPRESS,
                    help=text,
                    metavar=_metavar(info),
                )
        first = next(iter(sections.values()), parser)
        first.add_argument(
            "--config",
            dest="config",
            default=None,
            metavar="FILE",
            help=f"a TOML file: shared keys at the top, then a [{cls.section or 'role'}] table [{CONFIG_ENV}]",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Self:
        given = {k: v for k, v in vars(args).items() if k in cls.model_fields}
        return cls.load(config_path=getattr(args, "config", None), flags=given)

    @classmethod
    def command_parser(cls, module: str, doc: str, defaults: dict[str, str] | None = None) -> SettingsParser:
        """The parser of the role's command `python -m <module>`: the first paragraph of `doc` (the module's
        docstring), then one flag per setting (`add_arguments`, with its `defaults`)."""
        prog = f"python -m {module}"
        usage = f"{prog} [--config FILE] [--FLAG VALUE ...]"
        parser = SettingsParser(prog=prog, description=doc.split("\n\n")[0], usage=usage)
        cls.add_arguments(parser, defaults=defaults)
        return parser

    @classmethod
    def from_command(cls, parser: SettingsParser, argv: list[str] | None = None) -> tuple[Self, argparse.Namespace]:
        """The settings a role's command line gives (flags < env < TOML < defaults) and its parsed arguments,
        with logging set up at the settings' level. A configuration the role cannot run with exits 2 with
        `<module>: <why>`, as a bad flag does."""
        args = parser.parse_args(argv)
        try:
            settings = cls.from_args(args)
        except SettingsError as e:
            parser.exit(2, f"{parser.prog.removeprefix('python -m ')}: {e}\n")
        logs.configure(settings.log_level)
        return settings, args


def _problem(err: dict[str, Any], came_from: dict[str, str]) -> str:
    where = ".".join(map(str, err["loc"]))
    source = came_from.get(str(err["loc"][0])) if err["loc"] else None
    return f"{where}{f' (from {source})' if source else ''}: {err['msg']}"


# -- the command line ---------------------------------------------------------------------------------


class SettingsParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what was wrong, the closest valid flag or command where the
    word looks like a misspelling of one, and where to look (instead of the whole usage)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: {self._explained(message)} (see {self.prog} --help)\n")

    def _explained(self, message: str) -> str:
        if message.startswith("unrecognized arguments: "):
            given = message.split(": ", 1)[1].split()
            flag = next((w.split("=", 1)[0] for w in given if w.startswith("-")), None)
            if flag is not None:
                flags = self._flags()
                if flag in flags:  # a flag of another command: "did you mean" would name the flag itself
                    return f"unknown flag {flag} (only {', '.join(sorted(flags[flag]))} take it)"
                return f"unknown flag {flag}{_did_you_mean(flag, flags)}"
            return f"unexpected argument {given[0]!r}"
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            options = [c.strip().strip("'") for c in choice.group(2).split(",")]
            near = _did_you_mean(choice.group(1), options)
            return message.split(" (choose", 1)[0] + (near or f" (choose from {', '.join(options)})")
        return message

    def _flags(self) -> dict[str, set[str]]:
        """Every long flag of this parser and of its commands (a misspelled flag may be any command's), with
        the commands (their `prog`) that take it."""
        found: dict[str, set[str]] = {}
        todo: list[argparse.ArgumentParser] = [self]
        while todo:
            parser = todo.pop()
            for action in parser._actions:
                for flag in action.option_strings:
                    if flag.startswith("--"):
                        found.setdefault(flag, set()).add(parser.prog)
                if isinstance(action, argparse._SubParsersAction):
                    todo += list(action.choices.values())
        return found


class DefaultsFormatter(argparse.HelpFormatter):
    """argparse's help with each option's default, `(default: X)`, where its own words do not already say what
    it defaults to (the commands whose flags are not settings: evals.compare, evals.sweep, ...)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unsaid = action.default is None or action.default is argparse.SUPPRESS or action.default is False
        if "default" in text or unsaid or action.default == "" or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)".strip()

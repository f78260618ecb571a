"""The wire encoding of streams.schema's messages: a message <-> the flat field map of one stream entry.

An entry is a flat map so that `redis-cli XRANGE` shows it readably: strings as text, numbers in decimal,
booleans as 0/1, structured values (lists, dicts, a Member) as orjson, packed arrays (token ids, logprobs)
as raw little-endian bytes (`pack_int32`, `pack_float32`). Its fields, in order: `v` (the schema
version), the required fields, the optional fields not at their default (the rest are left out: shorter
entries, and half the arguments to pack, parse and decode on the hot path), and last a dead letter's
original fields under `f:`. A reader refuses a version it does not know rather than guessing (the consumer
runtime sends such entries to the dead letters), ignores fields it does not know (a newer writer's), and
raises SchemaError naming the field it cannot decode. docs/WIRE.md, "Entry schema", is the same in prose.

One codec, generated. Each class's fields give a table (name, encoder, decoder, default) and the table one
straight-line encoder and decoder, so the hot path runs no loop over the table, no per-field lookups and
no keyword arguments. A plain loop over the same tables, the simpler codec, cost the wire benchmark about
a third of its rate (docs/PERFORMANCE.md, "Wire"), past the tenth that simplicity may cost: it is gone. A
decode that fails is explained by `_explain`, which walks the table to the reason.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import numpy as np
import orjson

from streams.schema import BY_STREAM, SCHEMA_VERSION, DeadLetter, M, Member, Message, SchemaError

VERSION_FIELD = b"v"
ORIGINAL_PREFIX = b"f:"  # dead letters keep the original fields under this prefix, unchanged


# -- the tables: (field name, encoder, decoder, default) per class, built once from its type hints ---------


# Builtins where they fit (str.encode, bytes.decode, int and float parse bytes): this runs once per field
# of every entry on the hot path, where a Python-level wrapper costs a visible share.
_enc_str = str.encode
_dec_str = bytes.decode
_dec_int = int
_dec_float = float


def _enc_num(v: int | float) -> bytes:
    return repr(v).encode()


def _enc_bool(v: bool) -> bytes:
    return b"1" if v else b"0"


def _dec_bool(b: bytes) -> bool:
    if b not in (b"0", b"1"):
        raise ValueError(f"expected 0 or 1, got {b[:20]!r}")
    return b == b"1"


def _bytes(v: bytes) -> bytes:
    return bytes(v)


def _enc_member(v: Member) -> bytes:
    return orjson.dumps([v.seed, v.sign])


def _dec_member(b: bytes) -> Member:
    seed, sign = orjson.loads(b)
    if not isinstance(seed, int) or sign not in (1, -1):
        raise ValueError(f"member must be [seed, +-1], got {b[:40]!r}")
    return Member(seed, sign)


def _dec_json(b: bytes) -> Any:
    return orjson.loads(b)


def _dec_literal(choices: tuple[str, ...]):
    def dec(b: bytes) -> str:
        s = b.decode()
        if s not in choices:
            raise ValueError(f"{s[:40]!r} is not one of {', '.join(choices)}")
        return s

    return dec


def _codec_for(tp: Any) -> tuple[Any, Any]:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _codec_for(inner)
    if origin is Literal:
        return _enc_str, _dec_literal(typing.get_args(tp))
    table = {
        str: (_enc_str, _dec_str),
        int: (_enc_num, _dec_int),
        float: (_enc_num, _dec_float),
        bool: (_enc_bool, _dec_bool),
        bytes: (_bytes, _bytes),
        Member: (_enc_member, _dec_member),
    }
    if tp in table:
        return table[tp]
    if origin in (list, dict) or tp in (list, dict):
        return orjson.dumps, _dec_json
    raise TypeError(f"no stream encoding for {tp!r}")


_REQUIRED = object()


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    key: bytes
    enc: Any
    dec: Any
    default: Any  # _REQUIRED, or the value that is left out of the entry


def _table(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name == "original":  # DeadLetter's raw fields are handled by prefix, not by codec
            continue
        enc, dec = _codec_for(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _REQUIRED
        out.append(_Field(f.name, f.name.encode(), enc, dec, default))
    return tuple(out)


_TABLES: dict[type, tuple[_Field, ...]] = {cls: _table(cls) for cls in BY_STREAM.values()}
_VERSION = str(SCHEMA_VERSION).encode()


# -- the codec ---------------------------------------------------------------------------------------------


def encode(msg: Message) -> dict[bytes, bytes]:
    """Message -> flat stream fields, in the entry's order (the module's docstring)."""
    it = iter(_ENCODERS[type(msg)](msg))
    return dict(zip(it, it, strict=True))


def encode_flat(msg: Message) -> list[bytes]:
    """`encode(msg)` as one list, name, value, name, value, ...: the arguments XADD takes, built without
    the dict. What the publisher and the settle script send."""
    return _ENCODERS[type(msg)](msg)


def decode(cls: type[M], fields: dict[bytes, bytes]) -> M:
    """Flat stream fields -> message of class `cls`; SchemaError if that cannot be done faithfully."""
    return _DECODERS[cls](fields)


def decoder(cls: type[M]) -> Callable[[dict[bytes, bytes]], M]:
    """`decode` of class `cls`, one call less per entry on a hot path."""
    return _DECODERS[cls]


def _explain(cls: type, fields: dict[bytes, bytes], error: Exception) -> NoReturn:
    """Raise the SchemaError that says why `cls`'s decoder failed on `fields` (with `error`): a missing or
    unknown version, else the first field in the entry's order that does not decode, else the first
    required field that is missing."""
    version = fields.get(VERSION_FIELD)
    if version is None:
        raise SchemaError("missing schema version field 'v'")
    if version != _VERSION:
        raise SchemaError(f"unknown schema version {version[:20]!r} (this build reads {SCHEMA_VERSION})")
    table = _TABLES[cls]
    by_key = {f.key: f for f in table}
    for key, raw in fields.items():  # the entry's own fields: optional ones at their default are absent
        f = by_key.get(key)
        if f is None:  # `v`, a dead letter's `f:` fields, or a field a newer writer added
            continue
        try:
            f.dec(raw)
        except (ValueError, TypeError, UnicodeDecodeError, orjson.JSONDecodeError) as e:
            raise SchemaError(f"{cls.__name__}.{f.name}: cannot decode {raw[:40]!r}: {e}") from e
    for f in table:
        if f.default is _REQUIRED and f.key not in fields:
            raise SchemaError(f"{cls.__name__}: missing field {f.name!r}")
    raise SchemaError(f"{cls.__name__}: cannot decode the entry ({error!r})") from error


# The generated pair. Decoding builds the instance with `object.__new__` and the slots' own setters (a frozen
# dataclass's `__init__` goes through `object.__setattr__` per field, ~2x slower); no message class has a
# `__post_init__` to skip (checked below). Any failure goes to `_explain`, which raises the SchemaError.


def _inline(enc: Any, i: int, value: str) -> str:
    """Source of encoding `value` with field i's encoder: the small Python ones written out in place."""
    if enc is _enc_num:
        return f"repr({value}).encode()"
    if enc is _enc_bool:
        return f"(b'1' if {value} else b'0')"
    return f"E{i}({value})"


def _compile(cls: type) -> tuple[Any, Any]:
    assert not hasattr(cls, "__post_init__"), f"{cls.__name__}: decode would skip __post_init__"
    ns: dict[str, Any] = {"V": _VERSION, "new": object.__new__, "cls": cls, "explain": _explain}
    factories = {f.name: f.default_factory for f in dataclasses.fields(cls)}
    opening = ["b'v'", "V"]  # dataclasses put required fields first: they make the list's opening
    enc: list[str] = []
    dec = ["    get = fields.get", "    if get(b'v') != V:", "        raise ValueError", "    o = new(cls)"]
    for i, f in enumerate(_TABLES[cls]):
        ns[f"E{i}"], ns[f"D{i}"], ns[f"S{i}"], ns[f"K{i}"] = f.enc, f.dec, getattr(cls, f.name).__set__, f.key
        if f.default is _REQUIRED:
            assert not enc, "a required field after an optional one"
            opening += [f"K{i}", _inline(f.enc, i, f"msg.{f.name}")]
            dec.append(f"    S{i}(o, D{i}(fields[K{i}]))")
            continue
        ns[f"F{i}"] = f.default
        enc += [
            f"    x = msg.{f.name}",
            f"    if x is not F{i} and x != F{i}:",
            f"        out += (K{i}, {_inline(f.enc, i, 'x')})",
        ]
        dec.append(f"    r = get(K{i})")
        if factories[f.name] is not dataclasses.MISSING:  # a fresh {} or [] for each message, as __init__ does
            ns[f"N{i}"] = factories[f.name]
            dec.append(f"    S{i}(o, N{i}() if r is None else D{i}(r))")
        else:
            dec.append(f"    S{i}(o, F{i} if r is None else D{i}(r))")
    if cls is DeadLetter:
        ns.update(P=ORIGINAL_PREFIX, n=len(ORIGINAL_PREFIX), SO=cls.original.__set__)
        enc += ["    for k, v in msg.original.items():", "        out += (P + k, v)"]
        dec.append("    SO(o, {k[n:]: v for k, v in fields.items() if k.startswith(P)})")
    source = "\n".join(
        [
            "def enc(msg):",
            f"    out = [{', '.join(opening)}]",
            *enc,
            "    return out",
            "",
            "def dec(fields):",
            "  try:",
            *(f"  {line}" for line in dec),
            "      return o",  # the body inside try
            "  except Exception as e:",
            "    explain(cls, fields, e)",
        ]
    )
    exec(source, ns)  # noqa: S102 - the source is built above from our own tables
    return ns["enc"], ns["dec"]


_COMPILED = {cls: _compile(cls) for cls in _TABLES}
_ENCODERS = {cls: pair[0] for cls, pair in _COMPILED.items()}
_DECODERS = {cls: pair[1] for cls, pair in _COMPILED.items()}


# -- packed arrays (Attempt's token_ids, logprobs, prompt_ids) ---------------------------------------------


def pack_int32(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def pack_float32(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_int32(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<i4")


def unpack_float32(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")

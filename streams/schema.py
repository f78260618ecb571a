"""Versioned entry schemas of the run's streams, and their one encode/decode pair.

An entry is a flat map of stream fields so that `redis-cli XRANGE` shows it readably: strings as text,
numbers in decimal, booleans as 0/1, structured values as orjson, packed arrays (token ids, logprobs) as
raw little-endian bytes. Every entry carries `v`, the schema version; a reader refuses a version it does
not know rather than guessing (the consumer runtime sends such entries to the dead letters).

Direction and invariants are noted on each message class. Adding an optional field is compatible;
renaming or retyping one needs a new `SCHEMA_VERSION`.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
import orjson

SCHEMA_VERSION = 1
VERSION_FIELD = b"v"

Verdict = Literal["proved", "rejected", "timeout", "error"]
VERDICTS: tuple[str, ...] = typing.get_args(Verdict)


class SchemaError(ValueError):
    """An entry that can never be decoded by this build: missing field, unknown version, bad bytes.

    Deterministic: redelivering the same bytes fails the same way, so the runtime dead-letters it at once.
    """


@dataclass(frozen=True, slots=True)
class Member:
    """One ES population member: noise seed and sign (+1, or -1 for the antithetic twin)."""

    seed: int
    sign: int = 1


# ---------------------------------------------------------------------------------------------------------
# Messages. `stream` names the stream a message lives on; `dedup_id` names the idempotency marker a
# consumer of that message sets (`{ps:R}:done:<dedup_id>`), so a second delivery of the same logical
# input, even under another entry id, publishes nothing twice.


@dataclass(frozen=True, slots=True)
class WorkOrder:
    """trainer -> generators. Generate `samples_per_theorem` attempts for each theorem under one policy."""

    stream: ClassVar[str] = "work"

    work_id: str
    policy_version: int
    algo: Literal["es", "grpo"]
    task: str  # "lean" | "countdown"
    theorem_ids: list[str]
    samples_per_theorem: int = 1  # GRPO group size G; 1 for ES
    member: Member | None = None  # ES only: the perturbation to apply around `policy_version`
    sigma: float = 0.0  # ES only: the noise scale of `member` (weights = center + sigma * sign * eps(seed))
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, max_new_tokens, ...
    timeout_s: float = 600.0  # the generator's budget for this order; reclaim waits longer than this
    issued_ms: int = 0
    # The trainer's staleness bound: once the newest policy is more than this many versions past
    # `policy_version`, nobody will use the order's attempts and a generator skips it (None: no bound).
    max_staleness: int | None = None

    @property
    def dedup_id(self) -> str:
        return self.dedup_for(self.work_id)

    @staticmethod
    def dedup_for(work_id: str) -> str:
        """The marker name of order `work_id` (the trainer sets it to cancel an order it no longer needs)."""
        return f"work:{work_id}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """generators -> verifiers. One proof attempt. `attempt_id` derives from the work order, so a retried
    order republishes the same ids and verification stays exactly-once."""

    stream: ClassVar[str] = "attempts"

    attempt_id: str
    work_id: str
    theorem_id: str
    policy_version: int
    sample_index: int
    proof: str
    task: str = "lean"
    member: Member | None = None
    num_tokens: int = 0
    gen_ms: float = 0.0
    token_ids: bytes = b""  # GRPO: int32 little-endian, the sampled completion
    logprobs: bytes = b""  # GRPO: float32 little-endian, behaviour logprob of each sampled token
    prompt_ids: bytes = b""  # GRPO: int32 little-endian, the prompt exactly as the generator tokenized it
    # The model's whole completion (reasoning included), for the run's traces (trainer.traces); "" when it is
    # `proof` itself. Nobody judges it: the verifier reads `proof` only.
    text: str = ""

    @property
    def dedup_id(self) -> str:
        return f"attempt:{self.attempt_id}"


@dataclass(frozen=True, slots=True)
class Reward:
    """verifiers -> trainer. One verdict. `error` never travels here: an infrastructure failure leaves
    the attempt pending for redelivery instead of posing as a reward of 0."""

    stream: ClassVar[str] = "rewards"

    attempt_id: str
    theorem_id: str
    policy_version: int
    verdict: Verdict
    reward: float
    reason: str = ""  # rejected: lean_error | sorry | integrity; else empty
    member: Member | None = None
    work_id: str = ""
    sample_index: int = 0
    verify_ms: float = 0.0
    sandbox_id: str = ""
    cached: bool = False
    detail: str = ""  # short, human-readable: the first Lean error, the forbidden token, ...
    attempt_entry: str = ""  # the judged attempt's entry id in `attempts` (kept there for history_s): its text

    @property
    def dedup_id(self) -> str:
        return f"reward:{self.attempt_id}"


@dataclass(frozen=True, slots=True)
class PolicyUpdate:
    """trainer -> generators. A new policy version: an ES history entry, or GRPO weights on disk.

    Weights never travel through Redis: `weights_path` names a safetensors folder and `digest` its hash.
    """

    stream: ClassVar[str] = "policy"

    policy_version: int
    algo: Literal["es", "grpo"]
    es_step: dict[str, Any] | None = None  # {"seeds": [...], "signs": [...], "rewards": [...], "sigma", "alpha"}
    weights_path: str = ""
    digest: str = ""
    created_ms: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """any consumer -> ops. An entry given up on, with why, and its original fields byte for byte so
    `ops dlq requeue` can put it back exactly as it was."""

    stream: ClassVar[str] = "dlq"

    source: str  # full key of the stream the entry came from
    group: str
    original_id: str
    deliveries: int
    reason: str
    consumer: str = ""
    failed_ms: int = 0
    original: dict[bytes, bytes] = field(default_factory=dict)


Message = WorkOrder | Attempt | Reward | PolicyUpdate | DeadLetter
M = TypeVar("M", WorkOrder, Attempt, Reward, PolicyUpdate, DeadLetter)
BY_STREAM: dict[str, type] = {cls.stream: cls for cls in typing.get_args(Message)}

ORIGINAL_PREFIX = b"f:"  # dead letters keep the original fields under this prefix, unchanged


def fast_init(cls: type) -> type:
    """Give frozen, slotted dataclass `cls` an `__init__` that stores through the slots' own setters.

    Same signature, defaults and default factories as the one `dataclass` wrote, which goes through
    `object.__setattr__` once per field (the price of `frozen`): ~1.4 µs against ~0.8 µs for a 13-field
    message, paid for every message a role builds. Instances stay frozen (`__setattr__` still refuses).
    """
    fields = dataclasses.fields(cls)
    assert not hasattr(cls, "__post_init__") and all(f.init and not f.kw_only for f in fields), cls
    ns: dict[str, Any] = {"MISSING": object()}  # "not given": the default factory makes the value
    params, body = ["self"], []
    for i, f in enumerate(fields):
        ns[f"S{i}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            ns[f"F{i}"] = f.default
            params.append(f"{f.name}=F{i}")
            body.append(f"    S{i}(self, {f.name})")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"N{i}"] = f.default_factory
            params.append(f"{f.name}=MISSING")
            body.append(f"    S{i}(self, N{i}() if {f.name} is MISSING else {f.name})")
        else:
            params.append(f.name)
            body.append(f"    S{i}(self, {f.name})")
    exec(f"def __init__({', '.join(params)}):\n" + "\n".join(body), ns)  # noqa: S102 - built from the fields
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


for _cls in (Member, *BY_STREAM.values()):
    fast_init(_cls)


# ---------------------------------------------------------------------------------------------------------
# The codec: one table of (field name, encoder, decoder, required) per class, built once from its hints.


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
_GETTERS = {cls: operator.attrgetter(*(f.name for f in table)) for cls, table in _TABLES.items()}
_BY_KEY = {cls: {f.key: f for f in table} for cls, table in _TABLES.items()}
_REQUIRED_ORDER = {cls: [f.name for f in table if f.default is _REQUIRED] for cls, table in _TABLES.items()}
_REQUIRED_NAMES = {cls: frozenset(names) for cls, names in _REQUIRED_ORDER.items()}
_VERSION = str(SCHEMA_VERSION).encode()


def encode(msg: Message) -> dict[bytes, bytes]:
    """Message -> flat stream fields. Optional fields at their default are left out: shorter entries,
    and half the arguments to pack, parse and decode on the hot path."""
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


# The reference codec: loops over each class's table. The compiled pair below must agree with it byte for
# byte (tests/streams/test_schema.py checks that); it is also what explains a bad entry.


def _encode_generic(msg: Message) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {VERSION_FIELD: _VERSION}
    cls = type(msg)
    for f, value in zip(_TABLES[cls], _GETTERS[cls](msg), strict=True):
        if value is not f.default and value != f.default:
            out[f.key] = f.enc(value)
    if isinstance(msg, DeadLetter):
        for k, v in msg.original.items():
            out[ORIGINAL_PREFIX + k] = v
    return out


def _decode_generic(cls: type[M], fields: dict[bytes, bytes]) -> M:
    version = fields.get(VERSION_FIELD)
    if version is None:
        raise SchemaError("missing schema version field 'v'")
    if version != _VERSION:
        raise SchemaError(f"unknown schema version {version[:20]!r} (this build reads {SCHEMA_VERSION})")
    kwargs: dict[str, Any] = {}
    by_key = _BY_KEY[cls]
    for key, raw in fields.items():  # the entry's own fields: optional ones at their default are absent
        f = by_key.get(key)
        if f is None:  # `v`, a dead letter's `f:` fields, or a field a newer writer added
            continue
        try:
            kwargs[f.name] = f.dec(raw)
        except (ValueError, TypeError, UnicodeDecodeError, orjson.JSONDecodeError) as e:
            raise SchemaError(f"{cls.__name__}.{f.name}: cannot decode {raw[:40]!r}: {e}") from e
    if not _REQUIRED_NAMES[cls] <= kwargs.keys():
        missing = next(name for name in _REQUIRED_ORDER[cls] if name not in kwargs)
        raise SchemaError(f"{cls.__name__}: missing field {missing!r}")
    if cls is DeadLetter:
        n = len(ORIGINAL_PREFIX)
        kwargs["original"] = {k[n:]: v for k, v in fields.items() if k.startswith(ORIGINAL_PREFIX)}
    return cls(**kwargs)


# The compiled codec: per class, one straight-line encoder and decoder generated from the same table, so
# the hot path runs no loop over the table, no per-field attribute lookups and no keyword arguments.
# Decoding builds the instance with `object.__new__` and the slots' own setters (a frozen dataclass's
# `__init__` goes through `object.__setattr__` per field, ~2x slower); no message class has a
# `__post_init__` to skip (checked below). Any failure falls back to the generic decoder, which raises
# the SchemaError with its reason (or, should it succeed where the fast path failed, returns its message).


def _inline(enc: Any, i: int, value: str) -> str:
    """Source of encoding `value` with field i's encoder: the small Python ones written out in place."""
    if enc is _enc_num:
        return f"repr({value}).encode()"
    if enc is _enc_bool:
        return f"(b'1' if {value} else b'0')"
    return f"E{i}({value})"


def _compile(cls: type) -> tuple[Any, Any]:
    assert not hasattr(cls, "__post_init__"), f"{cls.__name__}: decode would skip __post_init__"
    ns: dict[str, Any] = {"V": _VERSION, "new": object.__new__, "cls": cls, "generic": _decode_generic}
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
        ["def enc(msg):", f"    out = [{', '.join(opening)}]", *enc, "    return out", "",
         "def dec(fields):", "  try:", *(f"  {line}" for line in dec), "      return o",  # the body inside try
         "  except Exception:", "    return generic(cls, fields)"]
    )  # fmt: skip
    exec(source, ns)  # noqa: S102 - the source is built above from our own tables
    return ns["enc"], ns["dec"]


_COMPILED = {cls: _compile(cls) for cls in _TABLES}
_ENCODERS = {cls: pair[0] for cls, pair in _COMPILED.items()}
_DECODERS = {cls: pair[1] for cls, pair in _COMPILED.items()}


def pack_int32(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def pack_float32(values) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def unpack_int32(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<i4")


def unpack_float32(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")

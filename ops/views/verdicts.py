"""`python -m ops verdicts clear --run R`: delete a run's verdict cache, `{ps:R}:verdicts`.
`python -m ops verdicts reasons [--newest N]`: the newest verdicts of a run counted, its refusals by reason
(`lean_error`, `sorry`, `integrity`, `statement_mismatch`, `wrong_answer`) and by the rule they name.

The cache (consumers.verifier) is one hash per run, and its fields never expire: Redis 7.0 has no per-field
TTL, and a verdict stays valid as long as its environment does (the environment is part of every field's
key, so a fixed checker or image is never served an old verdict: the old fields are merely dead weight).
Remove a run's cache once the run is finished. On a live run it costs only time: its verifiers check again
what they would have found cached. The run must be named on the command line (`--run`): the default run,
or one picked up from $PROOFSTREAM_RUN, is not enough for a deletion.

Same with redis-cli: `redis-cli HLEN '{ps:R}:verdicts'`, then `redis-cli UNLINK '{ps:R}:verdicts'`.

The counts read the newest rewards still in `{ps:R}:rewards` (the verifiers keep its `history_s`), with
`XREVRANGE '{ps:R}:rewards' + - COUNT N`: each entry's `verdict`, `reason` and `detail` fields. A rule is made
of fixed words only, so that "which check refuses most" reads at a glance: for a Countdown answer
(`wrong_answer`) the checker's rule, the first word of its detail (`format`, `syntax`, `equation`, `numbers`,
`value`; `other` for anything else); for the rest, the first line of the detail without the attempt's own
words (a helper's name, a quoted token or excerpt, a line number), which Lean's message goes on after.
"""

from __future__ import annotations

import argparse
import collections
import re
from typing import Any

import orjson
from redis.asyncio import Redis

from ops.views.text import on_copy
from streams.cluster import transaction
from streams.codec import decode
from streams.keys import Keys
from streams.schema import Reward, SchemaError
from tasks.countdown_check import RULES as COUNTDOWN_RULES

NEWEST = 10_000  # rewards counted by `reasons` (one XREVRANGE; a few MB at most)
RULES = 15  # the most frequent rules shown
RULE_CHARS = 120
# What of a refusal's detail is the attempt's own: a helper's name, a quoted token or a JSON-quoted excerpt,
# where it stands.
_OWN_WORDS = re.compile(r"""helper `[^`]*`|`[^`]*`|'[^']*'|"(?:[^"\\]|\\.)*"|\bline \d+|\d+ characters""")


async def clear(redis: Redis, keys: Keys) -> dict[str, Any]:
    """Delete the run's verdict cache; how many verdicts it held. One MULTI, so the count is what was deleted
    even while a verifier still writes. UNLINK: a cache of millions of fields is freed off Redis's main thread."""
    async with transaction(redis, keys.verdicts) as pipe:
        removed, _ = await pipe.hlen(keys.verdicts).unlink(keys.verdicts).execute()
    return {"run": keys.run, "key": keys.verdicts, "removed": removed}


def render_cleared(data: dict[str, Any]) -> str:
    line = f"removed {data['removed']} cached verdicts of run {data['run']} ({data['key']})"
    return line + ("\n" + on_copy(data["copy_of"]) if data.get("copy_of") else "")


async def cmd_clear(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    data = await clear(redis, keys)
    if getattr(args, "run_dir", None):
        data["copy_of"] = str(args.run_dir)
    print(orjson.dumps(data).decode() if getattr(args, "json", False) else render_cleared(data), flush=True)
    return 0


async def reasons(redis: Redis, keys: Keys, newest: int = NEWEST) -> dict[str, Any]:
    """The newest `newest` rewards of the run by verdict, its refusals (`rejected`) by reason and by rule."""
    verdicts, refused, rules = collections.Counter(), collections.Counter(), collections.Counter()
    for _, fields in await redis.xrevrange(keys.rewards, count=newest):
        try:
            reward = decode(Reward, fields)
        except SchemaError:
            continue  # an entry of another schema version: counted nowhere, as the trainer reads it
        verdicts[reward.verdict] += 1
        if reward.verdict == "rejected":
            refused[reward.reason] += 1
            rules[f"{reward.reason}: {rule_of(reward.reason, reward.detail)}"] += 1
    return {
        "run": keys.run,
        "counted": sum(verdicts.values()),
        "by_verdict": dict(verdicts.most_common()),
        "refused_by_reason": dict(refused.most_common()),
        "refused_by_rule": dict(rules.most_common(RULES)),
    }


def rule_of(reason: str, detail: str) -> str:
    """A refusal's rule, in fixed words (the module's docstring): never the model's text, never a second line."""
    if reason == "wrong_answer":
        word = detail.split(":", 1)[0]
        return word if word in COUNTDOWN_RULES else "other"
    first = detail.split("\n", 1)[0]
    rule = _OWN_WORDS.sub(lambda m: "helper" if m.group().startswith("helper") else "…", first)
    return "".join(c if c.isprintable() else "…" for c in rule)[:RULE_CHARS]


def render_reasons(data: dict[str, Any]) -> str:
    lines = [
        f"run {data['run']}: the newest {data['counted']} verdicts: "
        + (", ".join(f"{v} {n}" for v, n in data["by_verdict"].items()) or "none")
    ]
    lines += ["refused by reason:"] + [f"  {n:>7}  {r}" for r, n in data["refused_by_reason"].items()]
    lines += ["refused by rule:"] + [f"  {n:>7}  {r}" for r, n in data["refused_by_rule"].items()]
    return "\n".join(lines)


async def cmd_reasons(redis: Redis, keys: Keys, args: argparse.Namespace) -> int:
    data = await reasons(redis, keys, getattr(args, "newest", NEWEST))
    print(orjson.dumps(data).decode() if getattr(args, "json", False) else render_reasons(data), flush=True)
    return 0

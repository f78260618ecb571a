"""Redis key and consumer-group names of one run (DESIGN.md, "The wire").

Every key of a run carries the hash tag `{ps:<run>}` so the whole run lives on one Redis Cluster slot:
the Lua scripts that publish a result and ack its input touch several keys, and a script may only touch
keys of one slot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Consumer groups, one per reading role. A stream may be read by several groups (ops reads with XRANGE,
# never through a group, so it cannot steal or ack anything).
GENERATORS = "generators"  # reads work
VERIFIERS = "verifiers"  # reads attempts
TRAINER = "trainer"  # reads rewards

_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Keys:
    """All key names of run `run`. Pure names: nothing here talks to Redis."""

    run: str

    def __post_init__(self) -> None:
        # Braces or colons in a run id would break the hash tag or the key grammar below.
        if not _RUN_ID.match(self.run):
            raise ValueError(f"run id {self.run!r}: use 1-64 letters, digits, '_', '-' or '.'")

    @property
    def prefix(self) -> str:
        return f"{{ps:{self.run}}}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    @property
    def work(self) -> str:  # trainer -> generators: work orders
        return self._key("work")

    @property
    def attempts(self) -> str:  # generators -> verifiers: proof attempts
        return self._key("attempts")

    @property
    def rewards(self) -> str:  # verifiers -> trainer: verdicts
        return self._key("rewards")

    @property
    def dlq(self) -> str:  # any consumer -> ops: entries given up on
        return self._key("dlq")

    @property
    def policy(self) -> str:  # trainer -> generators: new policy versions
        return self._key("policy")

    @property
    def metrics(self) -> str:  # trainer -> ops: one entry per policy version
        return self._key("metrics")

    @property
    def theorems(self) -> str:  # hash theorem_id -> canonical statement, for integrity checks
        return self._key("theorems")

    @property
    def verdicts(self) -> str:  # hash digest(statement, proof, environment) -> cached verdict
        return self._key("verdicts")

    @property
    def verifier_stats(self) -> str:  # hash worker id -> JSON figures of that verifier process
        return self._key("verifier_stats")

    @property
    def trainer_state(self) -> str:  # hash: the trainer's checkpoint (JSON), written with each policy version
        return self._key("trainer")

    @property
    def generator_stats(self) -> str:  # hash generator id -> JSON figures of that generator process
        return self._key("generator_stats")

    @property
    def run_info(self) -> str:  # string: the trainer's settings and start (JSON, trainer/result.py), for ops
        return self._key("run")

    @property
    def trainer_lease(self) -> str:  # string with a TTL: the one trainer of the run (trainer/lease.py)
        return self._key("trainer_lease")

    @property
    def trainer_alert(self) -> str:  # string: why the run makes no progress, while it does not (trainer/progress.py)
        return self._key("trainer_alert")

    @property
    def es_noise(self) -> str:  # string: the device type ES noise is drawn on (the first ES generator sets it)
        return self._key("es_noise")

    def done(self, dedup_id: str) -> str:
        """Idempotency marker of one consumed input (string with a TTL)."""
        return self._key(f"done:{dedup_id}")

    def stream(self, name: str) -> str:
        """Full key of a stream given by its short name (`work`, `attempts`, ...), as ops commands take it."""
        if name not in STREAMS:
            raise ValueError(f"unknown stream {name!r}; one of: {', '.join(STREAMS)}")
        return self._key(name)

    def streams(self) -> dict[str, str]:
        return {name: self._key(name) for name in STREAMS}


STREAMS = ("work", "attempts", "rewards", "dlq", "policy", "metrics")

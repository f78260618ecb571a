"""The second line of the Lean verdict: a trusted program, in a fresh sandbox the proof never ran in, judges
the environment the REPL elaborated the proof into. Only its answer can turn the REPL's `proved` into ours.

Why: code run from the proof (a tactic's configuration term, an attribute, a tactic that compiles a term)
runs inside the REPL process and can write anything to its stdout, forging the answers to both
the proof and `#print axioms`. Nothing the REPL says after the proof ran is evidence. What it cannot forge
is the kernel's judgement, made elsewhere, of the declarations it holds. Design taken from lean4checker
(replay a module's constants through the kernel on top of its imports; Main.lean, `replayFromImports`),
SafeVerify (compare the submitted theorem's type with the target's and its axioms with an allowed list)
and comparator (the trusted side elaborates the statement itself and never runs the solution's code).

The steps, after the REPL's own answers said proved (LeanChecker):
1. Ask the REPL to pickle the proof's env: `{"pickleTo": PICKLE_PATH, "env": n}` (REPL/Main.lean,
   `pickleCommandSnapshot`; the file is `CommandSnapshot.pickle`'s `(imports, constants added after them,
   ...)`). Take that file out of the REPL's sandbox (`Sandbox.take_file`: read and removed, so that no
   earlier check's pickle can be served for a later one), at most MAX_PICKLE_BYTES.
2. Send it, with our header and canonical statement, to `lean-audit` (ops/deploy/images/lean/audit/Main.lean) in an
   audit sandbox of its own, replaced after every audit. The program elaborates our statement itself, reads
   the pickle's constants as data, replays all of them through the kernel (lean4checker's
   `Environment.replay'`) and reports facts: the theorem's kind, whether its type equals the canonical one,
   its axioms (`CollectAxioms`).
3. `judge_audit` turns the facts into the verdict: a theorem, of the canonical type, on the header's
   imports, depending on no axiom but propext, Classical.choice and Quot.sound.

Any reply outside the protocol is `rejected`/integrity: the audit program is ours and answers one way, so
other bytes mean the pickle it read subverted it. A sandbox that cannot start is `error` (never a reward).

Threats this line does not cover: a pickle crafted to corrupt the audit process while it is read (Lean
maps .olean data without validating it; the audit then answers whatever it is made to, within the
protocol) — the fresh sandbox per audit bounds it to that one verdict, and only an exporter plus an
independent kernel reading text (comparator with lean4export) closes it; bugs in Lean's kernel; resource
attacks (the sandbox's job).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from streams.theorems import Theorem
from tasks.lean_proof import theorem_name
from verifier_pool.judgement import Judgement, proved, rejected
from verifier_pool.lean_check import ALLOWED_AXIOMS, COMPILER_AXIOMS, DETAIL_CHARS
from verifier_pool.repl import Handshake
from verifier_pool.sandbox import Sandbox, SandboxCrashed, SandboxTimeout, SandboxUnavailable

log = structlog.get_logger("verifier_pool.lean_audit")

PROTOCOL = "proofstream-audit/1"
AUDIT_HANDSHAKE = Handshake({"hello": PROTOCOL}, {"hello": PROTOCOL})
AUDIT_ARGV = ("lean-audit",)  # in the Lean image, with the REPL's search path (ops/deploy/images/lean/Dockerfile)
PICKLE_PATH = "/tmp/proofstream-env.olean"  # in the REPL's sandbox; its /tmp is private to it
# A pickle holds the constants the proof added, proof terms included: tens of KB for competition proofs.
# Hex doubles it on the wire to the audit.
MAX_PICKLE_BYTES = 16 << 20
_FACTS = {"imports_match": bool, "kind": str, "type_matches": bool, "axioms": list}
_ANSWERS = ("facts", "pickle_error", "replay_error", "error")


def pickle_request(env: int) -> dict[str, Any]:
    """The REPL request that pickles env `env` to PICKLE_PATH; the REPL answers `{"env": env}`."""
    return {"pickleTo": PICKLE_PATH, "env": env}


def audit_request(theorem: Theorem, pickle: bytes) -> dict[str, Any]:
    return {
        "audit": {
            "header": theorem.header,
            "statement": theorem.statement,
            "name": theorem_name(theorem.statement),
            "pickle_hex": pickle.hex(),
        }
    }


def _integrity(detail: str) -> Judgement:
    return rejected("integrity", f"audit: {detail}"[:DETAIL_CHARS])


def judge_audit(reply: Any) -> Judgement:
    """The verdict from the audit program's reply (the module's docstring, step 3)."""
    if not isinstance(reply, dict) or len(reply) != 1 or next(iter(reply)) not in _ANSWERS:
        return _integrity(f"answered outside its protocol: {str(reply)[:200]}")
    [(kind, value)] = reply.items()
    if kind != "facts":
        if not isinstance(value, str):
            return _integrity(f"answered outside its protocol: {str(reply)[:200]}")
        if kind == "error":  # our header or statement did not elaborate in the audit: ours, not the proof's
            return Judgement("error", "", f"audit: {value}"[:DETAIL_CHARS])
        return _integrity(f"{kind}: {value}")  # the pickle the proof's REPL wrote is unreadable or ill-typed
    if not isinstance(value, dict) or value.keys() != _FACTS.keys():
        return _integrity(f"answered outside its protocol: {str(reply)[:200]}")
    if not all(isinstance(value[k], t) for k, t in _FACTS.items()) or not all(
        isinstance(a, str) for a in value["axioms"]
    ):
        return _integrity(f"answered outside its protocol: {str(reply)[:200]}")
    if not value["imports_match"]:
        return _integrity("the proof's environment was not built on the header's imports")
    if value["kind"] != "theorem":
        return _integrity(f"the statement's name is a {value['kind']} in the proof's environment, not a theorem")
    if not value["type_matches"]:
        return _integrity("the theorem's type is not the canonical statement's")
    axioms = set(value["axioms"])
    if "sorryAx" in axioms:
        return rejected("sorry", "audit: depends on sorryAx")
    if axioms & COMPILER_AXIOMS:
        return _integrity(f"trusts the compiler: {', '.join(sorted(axioms & COMPILER_AXIOMS))}")
    if axioms - ALLOWED_AXIOMS:
        return _integrity(f"uses axioms: {', '.join(sorted(axioms - ALLOWED_AXIOMS))}")
    return proved("kernel replay in a fresh sandbox")


class LeanAudit:
    """The audit program in its own sandbox, started for each audit and killed after it: each audit meets a
    process no earlier pickle has touched, and none outlives its audit. Not safe for concurrent use."""

    def __init__(self, sandbox: Sandbox, timeout_s: float) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s  # importing the header, elaborating the statement, replaying the proof
        self.unavailable: str | None = None  # why its sandbox could not start at the last try; None once it did

    async def probe(self) -> None:
        """Start the audit's sandbox once and kill it (the worker's start does this): a missing audit program
        or image shows in the health check before the first proof needs it, not as that proof's `error`."""
        try:
            await self.sandbox.start()
            self.unavailable = None
        except SandboxUnavailable as e:
            self.unavailable = str(e)
            log.error("audit_unavailable", sandbox_id=self.sandbox.sandbox_id, error=str(e)[:1000])
        finally:
            await self.sandbox.kill()

    async def audit(self, theorem: Theorem, pickle: bytes) -> Judgement:
        try:
            return await self._audit(theorem, pickle)
        finally:
            await self.sandbox.kill()

    async def _audit(self, theorem: Theorem, pickle: bytes) -> Judgement:
        """Twice on a crash, as the REPL's checks: a second crash is the pickle's doing."""
        for attempt in (1, 2):
            try:
                reply = await self.sandbox.request(audit_request(theorem, pickle), self.timeout_s)
            except SandboxUnavailable as e:
                self.unavailable = str(e)
                log.error("audit_unavailable", sandbox_id=self.sandbox.sandbox_id, error=str(e)[:1000])
                return Judgement("error", "", f"audit unavailable: {e}"[:DETAIL_CHARS])
            except SandboxTimeout:  # mostly our own work (importing the header): never scored as the proof's
                self.unavailable = None
                return Judgement("error", "", f"audit: no answer within {self.timeout_s:g} s")
            except SandboxCrashed as e:
                self.unavailable = None
                log.warning("audit_crashed", sandbox_id=self.sandbox.sandbox_id, attempt=attempt, error=str(e)[:300])
                if attempt == 2:
                    return _integrity(f"crashed twice on this proof's environment: {str(e)[:200]}")
                continue
            self.unavailable = None
            return judge_audit(reply)
        raise AssertionError("unreachable")


@dataclass
class SecondLine:
    """What stands behind a `proved` from a Lean server: the audit, or (only where the operator said so,
    `lean_second_line = "trust_repl"`) the server's own word. Every Lean checker's `proved` passes here.

    `audit` is None where no audit can run (a process backend without `lean_audit_cmd`, kimina-lean-server,
    which keeps the proof's environment to itself): then the verdict is `error`, retried and never a reward,
    unless `trust_repl`."""

    audit: LeanAudit | None
    trust_repl: bool = False
    _warned: bool = field(default=False, init=False, repr=False)  # `trust_repl` is logged once

    @property
    def unavailable(self) -> str | None:
        """Why a Lean proof cannot be `proved` here now (the health check's), or None."""
        if self.audit is not None:
            return None if self.audit.unavailable is None else f"the audit cannot start: {self.audit.unavailable}"
        if not self.trust_repl:
            return (
                "no second line: every Lean proof the server accepts is `error`; set lean_audit_cmd (process "
                "backend), or lean_second_line = 'trust_repl' to accept the Lean server's word"
            )
        return None

    @property
    def mode(self) -> str:
        """Part of the checker's cache key: a verdict taken on the server's word is never served as audited."""
        return "audited" if self.audit is not None else ("repl-word" if self.trust_repl else "unconfirmed")

    async def confirm(self, theorem: Theorem, pickle: bytes | None) -> Judgement:
        """The verdict on a proof the server said was proved. `pickle`: the proof's env as the REPL pickled
        it; None where the server cannot hand it over."""
        if self.audit is not None:
            if pickle is None:  # a checker given an audit must feed it: never fall back to the server's word
                return Judgement("error", "", "second line: an audit is configured but no pickle was given")
            return await self.audit.audit(theorem, pickle)
        if self.trust_repl:
            if not self._warned:
                log.warning("second_line_off", detail="proved on the Lean server's word: lean_second_line = trust_repl")
                self._warned = True
            return proved("the Lean server's word; no audit (lean_second_line = trust_repl)")
        return Judgement(
            "error",
            "",
            "second line unavailable: no audit can run here; set lean_audit_cmd, or "
            "lean_second_line = 'trust_repl' to accept the Lean server's word",
        )

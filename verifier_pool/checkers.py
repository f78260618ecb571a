"""Checkers: turn (canonical problem, model output) into a Judgement using one sandbox.

`LeanChecker` follows ../shared/LEAN_REPL.md "What proved must mean": assemble the checked text from
trusted parts, scan the body with a Lean tokenizer, elaborate it in command mode on top of the header's
env (elaborated once per REPL), then ask `#print axioms` as a separate command in the returned env.
`CountdownChecker` sends the answer to the Countdown checker program in the same kind of sandbox.

Classification: a request that runs past its limit is the proof's `timeout`; a sandbox that crashes is
replaced and the whole check run once more, and a second crash is blamed on the proof (a memory bomb
crashes every sandbox); a sandbox that cannot start, a header that does not elaborate, or a REPL that
answers outside its protocol is `error` (infrastructure: retried later, never a reward of 0).
"""

from __future__ import annotations

import structlog

from streams.theorems import Theorem
from verifier_pool import lean_check
from verifier_pool.judgement import Judgement, proved, rejected
from verifier_pool.sandbox import Sandbox, SandboxCrashed, SandboxTimeout, SandboxUnavailable

log = structlog.get_logger("verifier_pool.checkers")


async def _ask(sandbox: Sandbox, payload: dict, timeout_s: float) -> dict | Judgement:
    """One request. Returns the response, or the Judgement that ends the check; a crash propagates."""
    try:
        return await sandbox.request(payload, timeout_s)
    except SandboxTimeout:
        return Judgement("timeout", "", f"no answer within {timeout_s:g} s")
    except SandboxUnavailable as e:
        return Judgement("error", "", f"sandbox unavailable: {e}")


async def _twice(sandbox: Sandbox, check) -> Judgement:
    """Run `check` (all requests of one attempt); after a crash run it again on the fresh sandbox. A second
    crash is the input's doing: a memory bomb or a stack overflow crashes every sandbox."""
    for attempt in (1, 2):
        try:
            return await check()
        except SandboxCrashed as e:
            log.warning("sandbox_crashed", sandbox_id=sandbox.sandbox_id, attempt=attempt, error=str(e)[:300])
            if attempt == 2:
                return rejected("lean_error", f"the checker crashed twice on this input: {str(e)[:200]}")
    raise AssertionError("unreachable")


class CountdownChecker:
    environment = "countdown-checker-v1"

    def __init__(self, sandbox: Sandbox, timeout_s: float = 5.0) -> None:
        self.sandbox = sandbox
        self.timeout_s = timeout_s

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        return await _twice(self.sandbox, lambda: self._check_once(theorem, proof))

    async def _check_once(self, theorem: Theorem, proof: str) -> Judgement:
        job = {"numbers": theorem.numbers, "target": theorem.target, "answer": proof}
        reply = await _ask(self.sandbox, {"countdown": job}, self.timeout_s)
        if isinstance(reply, Judgement):
            return reply
        if "ok" not in reply:
            return Judgement("error", "", f"checker answered outside its protocol: {str(reply)[:200]}")
        if reply["ok"]:
            return proved(reply["detail"])
        return Judgement("rejected", "wrong_answer", reply["detail"], score=float(reply.get("score") or 0.0))


class LeanChecker:
    """Lean REPL in one sandbox; the header env is elaborated once per REPL process and reused."""

    def __init__(self, sandbox: Sandbox, *, proof_timeout_s: float = 60.0, header_timeout_s: float = 600.0,
                 toolchain: str = "unknown") -> None:  # fmt: skip
        self.sandbox = sandbox
        self.proof_timeout_s = proof_timeout_s
        self.header_timeout_s = header_timeout_s
        self.environment = f"lean:{toolchain}"
        self._header_envs: dict[str, int] = {}
        self._starts_seen = -1

    async def header_env(self, header: str) -> int | Judgement:
        """The env id of `header` in the current REPL process, elaborating it on first use."""
        starts = self.sandbox.stats().starts
        if starts != self._starts_seen:  # a new REPL process: env ids of the old one mean nothing
            self._header_envs.clear()
            self._starts_seen = starts
        if header not in self._header_envs:
            reply = await _ask(self.sandbox, {"cmd": header}, self.header_timeout_s)
            if isinstance(reply, Judgement):  # the header is ours, not the proof's: never the proof's fault
                return Judgement("error", "", f"header did not elaborate: {reply.detail}")
            bad = lean_check.judge_command(reply)
            if bad.verdict != "proved" or "env" not in reply:
                return Judgement("error", "", f"header did not elaborate: {bad.detail or reply}")
            self._header_envs[header] = reply["env"]
            self._starts_seen = self.sandbox.stats().starts
        return self._header_envs[header]

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        text = lean_check.prepare(proof, theorem.statement)  # trusted assembly + token scan, no sandbox time
        if isinstance(text, Judgement):
            return text
        # A retry after a crash elaborates the header again: env ids of the dead REPL mean nothing.
        return await _twice(self.sandbox, lambda: self._check_once(theorem, text))

    async def _check_once(self, theorem: Theorem, text: str) -> Judgement:
        env = await self.header_env(theorem.header)
        if isinstance(env, Judgement):
            return env
        reply = await _ask(self.sandbox, {"cmd": text, "env": env}, self.proof_timeout_s)
        if isinstance(reply, Judgement):
            return reply
        judgement = lean_check.judge_command(reply)
        if judgement.verdict != "proved":
            return judgement
        name = lean_check.theorem_name(theorem.statement)
        reply = await _ask(self.sandbox, {"cmd": lean_check.axioms_command(name), "env": reply["env"]},
                           self.proof_timeout_s)  # fmt: skip
        if isinstance(reply, Judgement):
            return reply
        return lean_check.judge_axioms(reply, name)

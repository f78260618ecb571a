"""Checkers: turn (canonical problem, model output) into a Judgement using one sandbox.

`LeanChecker` follows docs/brief/LEAN_REPL.md "What proved must mean": assemble the checked text from
trusted parts, scan the body with a Lean tokenizer, elaborate it in command mode on top of the header's
env (elaborated once per REPL), then ask `#print axioms` as a separate command in the returned env. Those
answers come from the process the proof's code ran in, so they only ever refuse: a `proved` is decided by
the second line (verifier_pool.lean_audit), which audits the pickled env in a fresh sandbox.
`CountdownChecker` sends the answer to the Countdown checker program in the same kind of sandbox.

Classification: a request that runs past its limit is the proof's `timeout`; a sandbox that crashes is
replaced and the whole check run once more, and a second crash is blamed on the proof (a memory bomb
crashes every sandbox); a sandbox that cannot start (at the check's first request, or when it is replaced
after a crash), a header that does not elaborate, or a REPL that answers outside its protocol is `error`
(infrastructure: retried later, never a reward of 0, never cached).

Cache key: a checker's `environment` names what judges: its own version and the digest of the judging code
on this side of the sandbox, and the sandbox's `identity` (image id, checker digest, toolchain). It is None
while no sandbox of the checker has answered its handshake since its last failed start: what would judge
is then unknown, and consumers.verifier neither consults nor fills the cache.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import structlog

from streams.theorems import Theorem
from tasks import lean_proof
from tasks.countdown_check import RULES as COUNTDOWN_RULES
from verifier_pool import lean_audit, lean_check
from verifier_pool.judgement import Judgement, proved, rejected
from verifier_pool.lean_audit import SecondLine
from verifier_pool.repl import LEAN_HANDSHAKE
from verifier_pool.sandbox import Sandbox, SandboxCrashed, SandboxTimeout, SandboxUnavailable

log = structlog.get_logger("verifier_pool.checkers")


# The code on our side of the sandbox that turns replies into verdicts (paths from the project root), the Lean
# task's text rules included. Its digest joins every sandboxed checker's environment: an edit to any of it
# never serves a verdict cached before the edit.
JUDGING_SOURCES = (
    "verifier_pool/checkers.py",
    "verifier_pool/judgement.py",
    "verifier_pool/lean_check.py",
    "verifier_pool/lean_commands.py",
    "verifier_pool/lean_preamble.py",
    "verifier_pool/lean_scan.py",
    "verifier_pool/kimina.py",
    "verifier_pool/lean_audit.py",
    "tasks/lean_proof.py",
    "tasks/lean_text.py",
)
JUDGING_DIGEST = hashlib.sha256(
    b"".join((Path(__file__).resolve().parent.parent / name).read_bytes() for name in JUDGING_SOURCES)
).hexdigest()[:16]


class _SandboxChecker:
    """What the checkers that own one sandbox share: asking it, knowing whether it could start, and the
    environment of their verdicts (the module's docstring)."""

    def __init__(self, sandbox: Sandbox, version: str) -> None:
        self.sandbox = sandbox
        self.version = version
        self.unavailable: str | None = None  # why the sandbox could not start at its last try; None once it answered

    @property
    def environment(self) -> str | None:
        if self.unavailable is not None or self.sandbox.stats().starts == 0:
            return None
        identity = getattr(self.sandbox, "identity", None)
        if identity == "":  # a backend with identities, between starts or after a failed one: unknown
            return None
        return f"{self.version}|{JUDGING_DIGEST}|{identity or ''}"

    async def _ask(self, payload: dict, timeout_s: float) -> dict | Judgement:
        """One request. Returns the response, or the Judgement that ends the check; a crash propagates."""
        try:
            reply = await self.sandbox.request(payload, timeout_s)
        except SandboxTimeout:
            return Judgement("timeout", "", f"no answer within {timeout_s:g} s")
        except SandboxUnavailable as e:  # its (re)start failed: the infrastructure's, whatever the input
            return self._unavailable(e)
        self.unavailable = None
        return reply

    def _unavailable(self, e: SandboxUnavailable) -> Judgement:
        """The sandbox could not (re)start: remembered for `environment`, logged, and an `error` verdict."""
        self.unavailable = str(e)
        log.error(
            "sandbox_unavailable", sandbox_id=self.sandbox.sandbox_id, backend=self.sandbox.backend, error=str(e)[:1000]
        )
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


class CountdownChecker(_SandboxChecker):
    def __init__(self, sandbox: Sandbox, timeout_s: float = 5.0) -> None:
        super().__init__(sandbox, "countdown-checker-v2")
        self.timeout_s = timeout_s

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        return await _twice(self.sandbox, lambda: self._check_once(theorem, proof))

    async def check_many(self, jobs: list[tuple[Theorem, str]]) -> list[Judgement]:
        """The verdicts of several answers, from one exchange where it can: a check takes well under a
        millisecond, and between two exchanges the sandbox waits for the worker's event loop (a slot's
        utilization was 0.87 with one exchange per answer; `python -m ops bench verifier`).

        The batch (`{"countdown_batch": [...]}`, tasks.countdown_check) gets one answer's limit for all its
        answers. A batch that runs past it, crashes its sandbox, or is answered outside the protocol (an older
        checker image that knows no batches) is a verdict on none of them: each is then checked alone, as
        `check` does, so an answer that hangs or crashes the checker is judged alone by the usual rules."""
        if len(jobs) == 1 or sum(len(proof) for _, proof in jobs) > MAX_BATCH_CHARS:
            return [await self.check(theorem, proof) for theorem, proof in jobs]
        batch = [_countdown_job(theorem, proof) for theorem, proof in jobs]
        try:
            reply = await self.sandbox.request({"countdown_batch": batch}, self.timeout_s)
        except (SandboxTimeout, SandboxCrashed) as e:
            log.warning(
                "countdown_batch_failed", sandbox_id=self.sandbox.sandbox_id, jobs=len(jobs), error=str(e)[:300]
            )
            reply = None
        except SandboxUnavailable as e:
            return [self._unavailable(e)] * len(jobs)
        else:
            self.unavailable = None
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list) or len(results) != len(jobs) or not all(isinstance(r, dict) for r in results):
            return [await self.check(theorem, proof) for theorem, proof in jobs]
        return [_countdown_judgement(r) for r in results]

    async def _check_once(self, theorem: Theorem, proof: str) -> Judgement:
        reply = await self._ask({"countdown": _countdown_job(theorem, proof)}, self.timeout_s)
        if isinstance(reply, Judgement):
            return reply
        return _countdown_judgement(reply)


MAX_BATCH_CHARS = 1 << 20  # answers longer than this in all are checked one by one (requests stay small)


def _countdown_job(theorem: Theorem, proof: str) -> dict:
    return {"numbers": theorem.numbers, "target": theorem.target, "answer": proof}


def _countdown_judgement(reply: dict) -> Judgement:
    if "ok" not in reply:
        return Judgement("error", "", f"checker answered outside its protocol: {str(reply)[:200]}")
    if reply["ok"]:
        return proved(reply["detail"])
    # The detail leads with the checker's rule, one of its fixed words: tools count refusals by it, and never
    # by the rest, which quotes the model's words (ops/views/verdicts.py).
    rule = reply.get("reason") if reply.get("reason") in COUNTDOWN_RULES else "other"
    detail = f"{rule}: {reply['detail']}"
    return Judgement("rejected", "wrong_answer", detail, score=float(reply.get("score") or 0.0))


class LeanChecker(_SandboxChecker):
    """Lean REPL in one sandbox; the header env is elaborated once per REPL process and reused.

    `second_line` decides every `proved`; the default has no audit and does not trust the REPL, so each
    proof the REPL accepts is `error` until one is given (verifier_pool.pool builds it from the settings)."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        proof_timeout_s: float = 60.0,
        header_timeout_s: float = 600.0,
        toolchain: str = "unknown",
        second_line: SecondLine | None = None,
    ) -> None:
        self.second_line = second_line or SecondLine(audit=None)
        super().__init__(sandbox, f"lean:{toolchain}:{self.second_line.mode}")
        self.proof_timeout_s = proof_timeout_s
        self.header_timeout_s = header_timeout_s
        self._header_envs: dict[str, int] = {}
        self._starts_seen = -1

    async def header_env(self, header: str) -> int | Judgement:
        """The env id of `header` in the current REPL process, elaborating it on first use."""
        starts = self.sandbox.stats().starts
        if starts != self._starts_seen:  # a new REPL process: env ids of the old one mean nothing
            self._header_envs.clear()
            self._starts_seen = starts
        if header not in self._header_envs:
            reply = await self._ask({"cmd": header}, self.header_timeout_s)
            if isinstance(reply, Judgement):  # the header is ours, not the proof's: never the proof's fault
                return Judgement("error", "", f"header did not elaborate: {reply.detail}")
            bad = lean_check.judge_command(reply)
            if bad.verdict != "proved" or "env" not in reply:
                return Judgement("error", "", f"header did not elaborate: {bad.detail or reply}")
            self._header_envs[header] = reply["env"]
            self._starts_seen = self.sandbox.stats().starts
        return self._header_envs[header]

    async def check(self, theorem: Theorem, proof: str) -> Judgement:
        # trusted assembly + token scan, no sandbox time
        # a namespace left open at the statement only where the audit checks how the statement reads
        audited = self.second_line.audit is not None
        text = lean_check.prepare(proof, theorem.statement, header=theorem.header, open_namespaces=audited)
        if isinstance(text, Judgement):
            return text
        # A retry after a crash elaborates the header again: env ids of the dead REPL mean nothing.
        return await _twice(self.sandbox, lambda: self._check_once(theorem, text))

    async def _check_once(self, theorem: Theorem, text: str) -> Judgement:
        # A REPL replaced without our noticing it first (a backend that restarts or recycles lazily, inside the
        # next request; a recycle right after the header's answer) knows none of our env ids, and says so
        # before elaborating anything: forget them and run the check once more from the header.
        for _ in range(2):
            judgement = await self._elaborate(theorem, text)
            if judgement is not None:
                return judgement
            self._header_envs.clear()
        return Judgement("error", "", "the REPL knew none of our env ids twice in one check")

    async def _elaborate(self, theorem: Theorem, text: str) -> Judgement | None:
        """The check on the header's env; None when the REPL did not know an env id we sent it."""
        env = await self.header_env(theorem.header)
        if isinstance(env, Judgement):
            return env
        reply = await self._ask({"cmd": text, "env": env}, self.proof_timeout_s)
        if isinstance(reply, Judgement):
            return reply
        if _unknown_env(reply):
            return None
        judgement = lean_check.judge_command(reply)
        if judgement.verdict != "proved":
            return judgement
        proof_env = reply["env"]
        name = lean_proof.theorem_name(theorem.statement)
        reply = await self._ask({"cmd": lean_check.axioms_command(name), "env": proof_env}, self.proof_timeout_s)
        if isinstance(reply, Judgement):
            return reply
        if _unknown_env(reply):
            return None
        judgement = lean_check.judge_axioms(reply, name)
        if judgement.verdict != "proved":
            return judgement
        return await self._confirm(theorem, proof_env)

    async def _confirm(self, theorem: Theorem, env: int) -> Judgement | None:
        """The second line on a proof the REPL accepted: pickle its env, take the file out of the sandbox,
        have it audited. None when the REPL did not know `env`."""
        if self.second_line.audit is None:
            return await self.second_line.confirm(theorem, None)
        reply = await self._ask(lean_audit.pickle_request(env), self.proof_timeout_s)
        if isinstance(reply, Judgement):
            return reply
        if _unknown_env(reply):
            return None
        if reply != {"env": env}:  # the REPL answers this one way; anything else was written by the proof
            return rejected("integrity", f"the REPL answered the pickle request with {str(reply)[:200]}")
        try:
            pickle = await self.sandbox.take_file(lean_audit.PICKLE_PATH, lean_audit.MAX_PICKLE_BYTES)
        except SandboxUnavailable as e:
            return Judgement("error", "", f"cannot take the pickle out of the sandbox: {e}")
        except (OSError, ValueError) as e:  # the REPL said it wrote it: gone, swapped or swollen since
            return rejected("integrity", f"the proof's pickle: {e}")
        return await self.second_line.confirm(theorem, pickle)


def _unknown_env(reply: dict) -> bool:
    """The REPL's answer to a command naming an env it does not have (the Lean handshake's reply): decided
    before the command is elaborated, so never the proof's doing."""
    return "env" not in reply and LEAN_HANDSHAKE.accepts(reply)

"""n attempts per held-out problem, sampled from the engine and checked in-process by the task's real checker
in its sandbox, built from the run's settings as the verifier pool builds it (verifier_pool/pool.py);
untrusted text runs nowhere else. A sample passes when its verdict is `proved` (Countdown: the exact answer);
its reward is the verifier's shaped reward of that verdict (consumers/verifier.py `reward_of`). No verdict
cache is read or written: every sample is checked.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from consumers.verifier import reward_of
from producers.engine import Sampling, in_engine_thread
from streams.theorems import Theorem
from tasks import prompts
from trainer.config import TrainerSettings
from trainer.local import verifier_fields
from verifier_pool.config import VerifierSettings

ROWS_PER_CALL = 64  # prompts x samples in one engine call: batched generation, bounded padding and memory
CHECK_TRIES = 3  # an `error` verdict (the checker could not judge) is retried, then the eval stops


@dataclass
class Verified:
    verdict: str
    reward: float
    reason: str
    detail: str
    answer: str
    tokens: int


@dataclass
class Timing:
    generate_s: float = 0.0
    verify_s: float = 0.0
    tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def verifier_settings(settings: TrainerSettings, config: str | None) -> VerifierSettings:
    """What the local pipeline hands its verifier (trainer/local.py), over the config's [verifier] table."""
    return VerifierSettings.load(config_path=config, flags={"run": settings.run, **verifier_fields(settings)})


async def judge(checker, theorem: Theorem, answer: str) -> tuple[str, float, str, str]:
    """(verdict, reward, reason, detail) from the real checker; `error` (no verdict) is retried, then fatal."""
    for _ in range(CHECK_TRIES):
        j = await checker.check(theorem, answer)
        if j.verdict != "error":
            return j.verdict, reward_of(j), j.reason, j.detail[:300]
    raise RuntimeError(
        f"the {theorem.task} checker could not judge an attempt at {theorem.theorem_id} "
        f"{CHECK_TRIES} times (infrastructure, not the attempt): {j.detail}"
    )


async def sample_and_verify(
    engine,
    checkers: list,
    held: list[Theorem],
    settings: TrainerSettings,
    timing: Timing,
    *,
    samples: int,
    temperature: float,
    seed: int,
) -> list[list[Verified]]:
    """`samples` per problem, generated in batches on the engine thread while the sandboxes check the last batch;
    the engine call of batch b samples with seed `seed + b`."""
    tokenizer = engine.tokenizer
    prompt_ids = [prompts.tokenize(tokenizer, prompts.messages(t, settings.prompt_format)) for t in held]
    results: list[list[Verified | None]] = [[None] * samples for _ in held]
    queue: asyncio.Queue = asyncio.Queue()

    async def generate() -> None:
        per_call = max(1, ROWS_PER_CALL // samples)
        for call, start in enumerate(range(0, len(held), per_call)):
            sampling = Sampling(
                n=samples, temperature=temperature, max_new_tokens=settings.max_new_tokens, seed=seed + call
            )
            started = time.monotonic()
            outputs = await in_engine_thread(engine.generate, prompt_ids[start : start + per_call], sampling)
            timing.generate_s += time.monotonic() - started
            for i, row in enumerate(outputs, start):
                for k, s in enumerate(row):
                    timing.tokens += len(s.token_ids)
                    answer = prompts.extract(held[i].task, s.text, settings.prompt_format)
                    queue.put_nowait((i, k, answer, len(s.token_ids)))
        for _ in checkers:
            queue.put_nowait(None)

    async def verify(checker) -> None:
        while (item := await queue.get()) is not None:
            i, k, answer, tokens = item
            started = time.monotonic()
            verdict, reward, reason, detail = await judge(checker, held[i], answer)
            timing.verify_s += time.monotonic() - started
            results[i][k] = Verified(verdict, reward, reason, detail, answer, tokens)

    tasks = [asyncio.create_task(generate()), *(asyncio.create_task(verify(c)) for c in checkers)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:  # one failed: the others stop too
            t.cancel()
    return results  # type: ignore[return-value]

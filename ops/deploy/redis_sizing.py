"""Redis memory per attempt, measured with the real wire: `python -m ops.redis_sizing [--profile lean]`.

Publishes N attempts of a realistic shape with the real Publisher, verifies them with the real consumer
runtime (settle script: idempotency marker, reward, ack; plus the verdict cache entry the verifier writes),
reads and acks the rewards as the trainer does, trims the acked attempts as the verifiers' sweep does, and
reads `INFO memory` (used_memory) and `MEMORY USAGE` along the way. Printed per attempt: the attempt entry,
the reward entry (kept until the trainer acked it `history_s` ago), the idempotency marker (TTL 7 days), the
verdict cache entry, and the totals while in flight and after the attempt is trimmed. Runs on a private
redis-server unless --redis-url names one; its keys are a run of their own (`sizing-<hex>`), deleted at the
end, so a live server is not flushed (but then other writers blur the totals).

Profiles: `countdown` (short expressions), `lean` (~1.5 KB proofs, a Lean error detail in rewards),
`grpo` (lean plus the packed token ids, behaviour logprobs and prompt ids of 1,024 + 256 tokens)."""

from __future__ import annotations

import argparse
import asyncio
import random
import uuid

import orjson
from redis.asyncio import Redis

from consumers.verifier import verdict_digest
from streams.cluster import is_cluster_url
from streams.codec import pack_float32, pack_int32
from streams.connect import connect
from streams.embedded import EmbeddedRedis
from streams.groups import trim_acked
from streams.keys import TRAINER, VERIFIERS, Keys
from streams.publisher import Publisher
from streams.runtime import Consumer, ConsumerSettings, Delivery
from streams.schema import Attempt, Member, Reward
from streams.theorems import Theorem
from verifier_pool.judgement import Judgement

_TACTICS = [
    "nlinarith [sq_nonneg (a - b), sq_nonneg (a + b)]",
    "simp only [Nat.add_comm, Nat.mul_comm]",
    "rcases h with ⟨x, hx⟩",
    "have h2 : 0 < x := by positivity",
    "norm_num at h ⊢",
    "omega",
    "field_simp",
    "ring_nf",
    "linarith [h₀, h₁]",
    "exact ⟨by norm_num, by norm_num⟩",
]


def attempt(profile: str, i: int, rng: random.Random) -> Attempt:
    work_id = f"es-v{i // 64}-m{i % 64}"
    grpo = profile == "grpo"
    if profile == "countdown":
        proof = f"({rng.randint(1, 99)} + {rng.randint(1, 99)}) * {rng.randint(2, 9)}"
    else:  # a Kimina-style proof body: ~1.5 KB of tactics, unique per attempt (as sampled proofs are)
        lines = [f"theorem t{i} (a b : ℝ) (h₀ : 0 < a) : a * b ≤ a ^ 2 + b ^ 2 := by"]
        while sum(map(len, lines)) < 1500:
            lines.append("  " + rng.choice(_TACTICS))
        proof = "\n".join(lines)
    return Attempt(
        attempt_id=f"{work_id}:{i % 8}:0",
        work_id=work_id,
        theorem_id=f"thm-{i % 500}",
        policy_version=i // 512,
        sample_index=0,
        proof=proof,
        task="countdown" if profile == "countdown" else "lean",
        member=None if grpo else Member(rng.getrandbits(31), 1),
        num_tokens=1024 if grpo else 200,
        gen_ms=round(rng.uniform(20, 900), 1),
        token_ids=pack_int32(rng.choices(range(49152), k=1024)) if grpo else b"",
        logprobs=pack_float32([rng.uniform(-8, 0) for _ in range(1024)]) if grpo else b"",
        prompt_ids=pack_int32(rng.choices(range(49152), k=256)) if grpo else b"",
    )


async def used(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def kill_clients(redis: Redis, name: str) -> None:
    """Free every connection named `name` now (CLIENT KILL frees another client before it replies)."""
    for client in await redis.client_list():
        if client["name"] == name:
            await redis.client_kill_filter(_id=client["id"])


async def measure(url: str, profile: str, n: int) -> dict:
    redis = connect(url)
    keys = Keys(f"sizing-{uuid.uuid4().hex[:8]}")
    rng = random.Random(0)
    figures: dict = {"profile": profile, "attempts": n}
    try:
        start = await used(redis)
        # Published on connections of their own, gone before the reading: Redis keeps a client's query buffer
        # (here ~1 MB of pipelined attempts) until its cron shrinks it, and used_memory counts it, so reading
        # through the writing connection added up to ~1 KB an attempt, depending on when the cron ran. Closing
        # them is not enough: the server frees a closed client when its event loop reads the EOF, which can
        # come after our next command (a CI run measured 3,113 bytes for 1,874), so they are killed by name
        # first, which frees them before CLIENT KILL replies.
        name = f"ps-sizing-writer-{uuid.uuid4().hex[:8]}"
        writer = connect(url, client_name=name)
        publisher = Publisher(writer, keys)
        for lo in range(0, n, 500):
            await publisher.publish([attempt(profile, i, rng) for i in range(lo, min(n, lo + 500))])
        await kill_clients(redis, name)
        await writer.aclose()
        after_attempts = await used(redis)

        detail = "" if profile == "countdown" else "unsolved goals\na b : ℝ\nh₀ : 0 < a\n⊢ a * b ≤ a ^ 2 + b ^ 2"

        countdown = profile == "countdown"
        reason = "wrong_answer" if countdown else "lean_error"
        judgement = Judgement("rejected", reason, detail, 0.3 if countdown else None)

        async def verify(d: Delivery[Attempt]) -> list[Reward]:  # what VerifyHandler writes, minus the check
            a = d.message
            theorem = Theorem(a.theorem_id, a.task, statement="theorem t (a b : ℝ) : a * b ≤ a ^ 2 + b ^ 2 := by")
            await redis.hset(keys.verdicts, verdict_digest(theorem, a.proof, "v4.19.0+mathlib"), judgement.encode())
            return [
                Reward(
                    attempt_id=a.attempt_id,
                    theorem_id=a.theorem_id,
                    policy_version=a.policy_version,
                    verdict="rejected",
                    reward=0.3 if countdown else 0.0,
                    reason=reason,
                    member=a.member,
                    work_id=a.work_id,
                    verify_ms=round(rng.uniform(2, 4000), 3),
                    sandbox_id="process-lean-0-12345",
                    detail=detail,
                )
            ]

        settings = ConsumerSettings(batch_size=256, block_ms=10)
        verifier = Consumer(
            redis,
            keys,
            message_type=Attempt,
            group=VERIFIERS,
            name="sizing-verifier",
            handler=verify,
            output=Reward,
            settings=settings,
        )
        await verifier.ensure_group()
        while verifier.stats.processed < n:
            await verifier.run_once()
        after_verify = await used(redis)

        # The trainer reads rewards in its group and acks them (no markers: trainer/loop.py), as here.
        await redis.xgroup_create(keys.rewards, TRAINER, id="0", mkstream=True)
        read = 0
        while read < n:
            reply = await redis.xreadgroup(TRAINER, "sizing-trainer", {keys.rewards: ">"}, count=1000, block=100)
            ids = [entry_id for _, entries in reply for entry_id, _ in entries]
            if ids:
                await redis.xack(keys.rewards, TRAINER, *ids)
            read += len(ids)
        rewards_bytes = await redis.memory_usage(keys.rewards, samples=0)
        await trim_acked(redis, keys.attempts)  # what the verifiers' sweep does; rewards stay for history_s
        run_keeps = await used(redis)
        figures["bytes_per_attempt"] = {
            "attempt_entry": round((after_attempts - start) / n),
            "reward_entry": round(rewards_bytes / n),
            "done_marker": await redis.memory_usage(keys.done(attempt(profile, 0, random.Random(0)).dedup_id)),
            "verdict_cache_entry": round(await redis.memory_usage(keys.verdicts, samples=0) / n),
            # attempt + reward + marker + verdict cache + Redis's own dict/expiry overhead, while verifying
            "in_flight": round((after_verify - start) / n),
            # once the attempt is acked and trimmed: reward + marker (7 days) + verdict cache
            "after_trim": round((run_keeps - start) / n),
        }
        figures["redis_version"] = (await redis.info("server"))["redis_version"]
    finally:
        names = [k async for k in redis.scan_iter(match=f"{keys.prefix}*", count=1000)]
        for lo in range(0, len(names), 500):
            await redis.unlink(*names[lo : lo + 500])
        await redis.aclose()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.redis_sizing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=["countdown", "lean", "grpo"], default="lean")
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--redis-url", default=None, help="default: a private redis-server")
    args = parser.parse_args(argv)
    if args.redis_url and is_cluster_url(args.redis_url):  # INFO memory is one server's figure
        parser.error("measures one Redis server: give --redis-url redis://HOST:PORT of one (a cluster's master)")
    if args.redis_url:
        figures = asyncio.run(measure(args.redis_url, args.profile, args.attempts))
    else:
        with EmbeddedRedis() as server:
            figures = asyncio.run(measure(server.url, args.profile, args.attempts))
    print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    return 0

"""`python -m ops bench es-throughput`: how close ES members come to pure inference (EGGROLL's measure).

The same rows three ways on one engine, greedy, `--max-new-tokens` at most, on `--problems` Countdown
prompts for each of `--population` members:

- `inference`: the center alone, one engine call of population x problems rows (no perturbation at all):
  the ceiling.
- `lowrank`: the population's low-rank members (rank `--rank`) in one call (`es_members`: the center in the
  weights, each row adding its member's term), as a generator serves an ES bundle.
- `full`: the full-rank members as before: each member written into the weights, its problems generated,
  the center put back (`--no-full` leaves it out).

Each is generated tokens per second of its whole wall time (perturbations included); `ratio` =
lowrank / inference (EGGROLL reports 0.91), `full_ratio` = full / inference. A member's answers differ
from the center's, so row lengths differ between the ways: tokens per second, not seconds, are compared.
A call's rows share its steps, so tokens written late by a few rows cost more each than tokens written while
the batch is full: where the members write longer answers than the center (a member that runs to the cap
while the center's answers end early), `ratio` counts that against them. `--fixed-length` takes the lengths
out: every row writes `--max-new-tokens` tokens (the sampling's `ignore_eos`), so every way does the same
work and `ratio` is what the low-rank terms themselves cost. `useful` is the share of the rows' decoding
steps that wrote a token: the hf engine counts the row-steps it computed (`row_steps`); a row leaves its
call's batch at the step it ends (producers/hf.py), so `useful` is 1 there, and was tokens / (rows x steps)
when a call decoded every row until its longest ended (the hf engine with `drop_finished=False` or a static
cache; the estimate for an engine that counts nothing), and is below 1 where the hf engine's look-ahead fed
drafted tokens the model did not choose (`lookahead`: its last rows feed drafts, `--lookahead 0` none).
`longest`: the longest answer of the way, in tokens.
Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import time

from ops.bench import common


def bench(args: argparse.Namespace) -> dict:
    import torch  # imported when the bench runs, so `python -m ops` starts without it

    from producers.engine import Sampling
    from producers.engines import choose, make_engine
    from tasks import prompts
    from tasks.countdown import countdown_problems
    from weights import device as devices
    from weights.model import resolve_model

    device = devices.resolve(args.device)
    engine_name = choose(args.engine)
    options = {"lookahead": args.lookahead} if args.lookahead is not None and engine_name == "hf" else {}
    engine = make_engine(
        engine_name, resolve_model(args.model), threads=args.threads, device=device, dtype="auto", **options
    )
    problems = countdown_problems(args.problems, seed=args.seed, curriculum="easy")
    members = [(1000 + i // 2, (1, -1)[i % 2]) for i in range(args.population)]  # antithetic pairs
    sampling = Sampling(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=args.fixed_length)
    out: dict = {}
    try:
        ids = [prompts.tokenize(engine.tokenizer, prompts.messages(t)) for t in problems]
        engine.es_use(0, None)
        engine.generate(ids[:2], Sampling(n=1, temperature=0.0, max_new_tokens=4))  # warm, off the clock

        def timed(name: str, run, one_call: bool) -> None:
            """`run` returns [part][row][sample]: its parts are one engine call (`one_call`), or a call each."""
            computed = getattr(engine, "row_steps", None)
            started = time.perf_counter()
            parts = run()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            lengths = [[len(s.token_ids) for row in part for s in row] for part in parts]
            calls = [[n for part in lengths for n in part]] if one_call else lengths
            tokens = sum(map(sum, calls))
            if computed is not None:  # the engine counts the row-steps it computed (hf: rows leave as they end)
                decoded = engine.row_steps - computed
            else:  # an engine call decodes until its longest row ends
                decoded = sum(len(call) * max(call, default=0) for call in calls)
            out[name] = {
                "s": round(seconds, 2),
                "tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1),
                "longest": max(map(max, calls)),
                "useful": round(tokens / max(decoded, 1), 3),
            }

        timed("inference", lambda: [engine.generate([p for _ in members for p in ids], sampling)], True)
        timed("lowrank", lambda: engine.es_members(0, members, args.sigma, args.rank, ids, sampling), True)
        if args.full:

            def full():
                rows = []
                for seed, sign in members:
                    engine.es_use(0, seed, sign, args.sigma)
                    rows.append(engine.generate(ids, sampling))
                engine.es_use(0, None)
                return rows

            timed("full", full, False)
    finally:
        engine.close()
    base = out["inference"]["tokens_per_s"]
    return {
        "bench": "es-throughput",
        "engine": engine_name,
        **devices.describe(device),
        "threads": torch.get_num_threads(),
        "population": args.population,
        "problems": args.problems,
        "rows": args.population * args.problems,
        "max_new_tokens": args.max_new_tokens,
        "fixed_length": args.fixed_length,
        "rank": args.rank,
        "sigma": args.sigma,
        "lookahead": getattr(engine, "lookahead", None),
        **out,
        "ratio": round(out["lowrank"]["tokens_per_s"] / base, 3),
        "full_ratio": round(out["full"]["tokens_per_s"] / base, 3) if "full" in out else None,
    }


def summary(result: dict) -> str:
    full = f", full-rank members {result['full_ratio']}" if result["full_ratio"] is not None else ""
    return (
        f"es-throughput ({result['engine']} on {result.get('gpu', result['device'])}, {result['rows']} rows): "
        f"low-rank members at {result['ratio']} of pure inference's tokens/s "
        f"({result['lowrank']['tokens_per_s']} against {result['inference']['tokens_per_s']}){full}"
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    about = "ES members' tokens/s against pure batched inference (EGGROLL)"
    p = common.add_bench(sub, "es-throughput", about, bench, summary)
    common.add_engine(p)
    common.add_device(p, "where the engine runs")
    common.add_model(p)
    p.add_argument("--population", type=int, default=8, help="members (antithetic pairs; default 8)")
    p.add_argument("--problems", type=int, default=16, help="Countdown prompts each member answers (default 16)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens at most (default 64)")
    p.add_argument("--rank", type=int, default=4, help="the low-rank members' r (default 4)")
    p.add_argument("--sigma", type=float, default=0.001, help="noise scale (default 0.001, the presets')")
    p.add_argument("--seed", type=int, default=0, help="seed of the Countdown problems (default 0)")
    p.add_argument(
        "--full",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure full-rank members written in turn (default on)",
    )
    p.add_argument(
        "--fixed-length",
        action="store_true",
        help="every row writes --max-new-tokens tokens, EOS not stopped at: every way does the same work, so "
        "the ratio is the low-rank terms' own cost (default: the rows end at their EOS, as in a run)",
    )
    p.add_argument(
        "--lookahead",
        type=int,
        default=None,
        help="hf: drafted tokens a greedy call's last rows feed a step (default: the engine's, "
        "producers/hf.py LOOKAHEAD; 0: one token a step)",
    )
    common.add_threads(p)
    common.add_ending(p)

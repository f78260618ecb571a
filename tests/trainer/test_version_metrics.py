"""Each version's common metrics (trainer/version_metrics.py), and the rules the loop applies to orders
(expiry, dead letters, rewards, evaluations), as pure functions without Redis: inputs chosen so that every
expected value is worked out by hand here."""

from __future__ import annotations

from trainer.es import member_spread
from trainer.held_out import result as eval_result
from trainer.orders import Order, at_quorum, expired, room
from trainer.trackers import tracked
from trainer.version_metrics import health_figures, version_metrics


def _order(work_id: str, center: int, rewards: list[float], proved: int = 0, issued_at: float = 0.0) -> Order:
    scored = {f"{work_id}:{k}:0": r for k, r in enumerate(rewards)}
    return Order(work_id, center, 0, 1, ["t"] * len(rewards), rewards=scored, proved=proved, issued_at=issued_at)


def test_a_version_s_common_figures_in_their_order():
    """Stepping from version 5: orders of centers 5, 5, 4 used (lags 0, 0, 1), one dropped as stale. Rewards
    1, 0 | 0.5 | 1, 1: 5 attempts, sum 3.5, mean 0.7; 3 proved of 5: 0.6. 4 rewards read in 2 s: 2 a second."""
    used = [_order("a", 5, [1.0, 0.0], proved=1), _order("b", 5, [0.5]), _order("c", 4, [1.0, 1.0], proved=2)]
    stale = [_order("d", 2, [1.0])]
    read = {"proved": 3, "wrong": 1}
    metrics = version_metrics(6, "es", 5, used, stale, 15, read, 2.0)
    assert metrics == {
        "version": 6,
        "algo": "es",
        "reward_mean": 0.7,
        "pass_rate": 0.6,
        "attempts": 5,
        "samples": 15,
        "stale_dropped": 1,
        "staleness": {"0": 2, "1": 1},
        "verdicts": {"proved": 3, "wrong": 1},
        "rewards_per_s": 2.0,
        "update_s": 2.0,
    }
    assert list(metrics) == [
        "version",
        "algo",
        "reward_mean",
        "pass_rate",
        "attempts",
        "samples",
        "stale_dropped",
        "staleness",
        "verdicts",
        "rewards_per_s",
        "update_s",
    ]


def test_a_version_without_attempts_has_zero_rates_not_a_division_error():
    metrics = version_metrics(1, "grpo", 0, [], [], 0, {}, 0.0)
    assert (metrics["reward_mean"], metrics["pass_rate"], metrics["attempts"], metrics["staleness"]) == (0, 0, 0, {})
    assert (metrics["rewards_per_s"], metrics["update_s"]) == (0.0, 0.0)


def test_health_figures_count_what_is_in_flight_and_what_was_lost():
    """Issued at 100 and 90 (0: unknown, not counted for the age); at 130 the oldest is 40 s old. Only the counts
    of lost outcomes (`cut_*`, `evals_*`) are health figures."""
    running = [_order("a", 1, [], issued_at=100.0), _order("b", 1, [], issued_at=90.0), _order("c", 1, [])]
    counts = {"cut_timeout": 1, "evals_lost": 2, "samples": 9, "resumes": 1}
    assert health_figures(running, 2, counts, 130.0) == {
        "in_flight": 3,
        "oldest_in_flight_s": 40.0,
        "evals_in_flight": 2,
        "cut_timeout": 1,
        "evals_lost": 2,
    }
    assert health_figures([], 0, {}, 130.0) == {"in_flight": 0, "oldest_in_flight_s": None, "evals_in_flight": 0}


def test_orders_expire_past_the_staleness_bound_or_the_timeout():
    """At version 5, bound 1, timeout 600 s, now 1000: center 3 is stale (lag 2); center 4 issued at 100 waited
    900 s; center 5 issued at 900 waited 100 s; the evaluation issued at 300 waited 700 s. Watching since 500,
    the waits count from there: 500 s for the first two, so only the stale one goes."""
    stale, late, fresh = _order("s", 3, [], issued_at=950.0), _order("l", 4, [], issued_at=100.0), _order("f", 5, [])
    fresh.issued_at = 900.0
    evaluation = _order("eval-v4", 4, [], issued_at=300.0)
    lost = expired([stale, late, fresh], [evaluation], 5, 1, 600.0, 0.0, 1000.0)
    assert [(o.work_id, why, detail) for o, why, detail in lost] == [
        ("s", "stale", "center 3, now at version 5"),
        ("l", "timeout", "unanswered for 900 s"),
        ("eval-v4", "timeout", "unanswered for 700 s"),
    ]
    assert [
        (o.work_id, why) for o, why, _ in expired([stale, late, fresh], [evaluation], 5, 1, 600.0, 500.0, 1000.0)
    ] == [("s", "stale")]


def test_a_dead_letter_names_the_orders_it_loses():
    """A skipped bundle loses each member it carried; a letter of another kind is a dead letter; an entry
    deleted after it was read (no fields) or one that is not a dead letter loses nothing."""
    from streams.codec import encode
    from streams.schema import DeadLetter
    from trainer.orders import letter_losses

    bundle = {b"work_id": b"es-v1-m0+1-abc", b"members": b'[{"work_id":"es-v1-m0"},{"work_id":"es-v1-m1"}]'}
    skipped = DeadLetter("work", "generators", "1-0", 1, "skipped: stale", "g", 0, bundle)
    assert letter_losses(encode(skipped)) == ("skipped", "skipped: stale", ["es-v1-m0+1-abc", "es-v1-m0", "es-v1-m1"])
    dead = DeadLetter("attempts", "verifiers", "2-0", 5, "infrastructure: x", "v", 0, {b"work_id": b"grpo-v0-g1"})
    assert letter_losses(encode(dead)) == ("dead_letter", "infrastructure: x", ["grpo-v0-g1"])
    assert letter_losses({}) == ("", "", []) == letter_losses({b"v": b"1", b"nonsense": b"x"})


def test_an_evaluation_is_asked_again_twice_then_given_up_and_its_result_is_the_held_out_mean():
    from trainer.held_out import EVAL_TRIES, eval_order, next_try, result

    first = eval_order(3, [])
    assert (first.work_id, EVAL_TRIES) == ("eval-v3", 3)
    assert next_try(first) == "eval-v3-r1"
    assert next_try(eval_order(3, [], "eval-v3-r1")) == "eval-v3-r2"
    assert next_try(eval_order(3, [], "eval-v3-r2")) is None  # the third loss: given up
    done = _order("eval-v3", 3, [1.0, 0.5], proved=1)  # 2 problems, rewards 1 and 0.5, one proved
    assert result(done) == {"version": 3, "held_out_reward": 0.75, "held_out_exact": 0.5, "problems": 2}


def test_a_reward_counts_once_and_only_for_an_order_in_flight():
    from streams.schema import Reward
    from trainer.run_state import RunState

    state = RunState("r")
    state.orders["es-v0-m0"] = _order("es-v0-m0", 0, [])
    state.evals["eval-v0"] = _order("eval-v0", 0, [])

    def reward(work_id: str, k: int, value: float, verdict: str) -> Reward:
        return Reward(f"{work_id}:{k}:0", "t", 0, verdict, value, work_id=work_id)  # type: ignore[arg-type]

    assert state.add(reward("es-v0-m0", 0, 1.0, "proved")) == ""
    assert state.add(reward("es-v0-m0", 0, 0.0, "rejected")) == "duplicate_rewards"  # the same attempt again
    assert state.add(reward("es-v0-m0", 1, 0.5, "rejected")) == ""
    assert state.add(reward("eval-v0", 0, 1.0, "proved")) == ""
    assert state.add(reward("es-v0-m7", 0, 1.0, "proved")) == "late_rewards"  # used, dropped or never issued
    member = state.orders["es-v0-m0"]
    assert (member.rewards, member.proved) == ({"es-v0-m0:0:0": 1.0, "es-v0-m0:1:0": 0.5}, 1)
    assert (state.evals["eval-v0"].rewards, state.evals["eval-v0"].proved) == ({"eval-v0:0:0": 1.0}, 1)


def test_top_up_room_is_lockstep_at_quorum_1_and_counts_unfinished_orders_below():
    """At quorum 1 a version gets `size` orders, finished or not: 3 of center 4 out of 4 leaves room for 1 (the
    center-3 order does not count). Below 1 only the unfinished count: b, c and d (a alone usable) out of 4
    leave room for 1."""
    orders = [_order("a", 4, [1.0]), _order("b", 4, []), _order("c", 4, []), _order("d", 3, [])]

    def finished(o: Order) -> bool:
        return o.work_id == "a"

    assert room(4, orders, version=4, quorum=1.0, usable=finished) == 1
    assert room(4, orders, version=4, quorum=0.75, usable=finished) == 1
    assert room(3, orders, version=4, quorum=1.0, usable=finished) == 0


def test_an_update_is_ready_at_its_quorum_of_fresh_orders_or_at_the_deadline():
    """Version 5, max staleness 1: orders of centers 5, 4, 3 hold 2 fresh ones (lags 0 and 1; lag 2 is stale).
    Quorum 0.5 of 4 is 2: ready. Quorum 0.75 of 4 is 3: not before the deadline, then yes (2 >= at_least 2),
    and never with fewer than `at_least` fresh."""
    usable = [_order("a", 5, [1.0]), _order("b", 4, [1.0]), _order("c", 3, [1.0])]
    assert at_quorum(usable, 4, 1, 5, 1, 0.5, past_deadline=False) == "quorum"
    assert at_quorum(usable, 4, 1, 5, 1, 0.75, past_deadline=False) is None
    assert at_quorum(usable, 4, 2, 5, 1, 0.75, past_deadline=True) == "deadline"
    assert at_quorum(usable, 4, 3, 5, 1, 0.75, past_deadline=True) is None


def test_an_evaluation_keeps_each_problem_and_says_its_line_when_it_lands(tmp_path):
    """Version 0 scores 0.1 and 0.1 (mean 0.1, none solved); version 4 answers h0 with 1.0 (proved) and h1 with
    0.5: mean 0.75, 1 of 2 solved, +0.65 against version 0. Its record keeps each problem; the checkpoint's
    result only the means; a training order keeps nothing by problem (its checkpoint keys unchanged)."""
    from streams.schema import Reward
    from streams.theorems import Theorem
    from trainer.held_out import Evaluations, eval_order
    from trainer.metrics import MetricsSink
    from trainer.run_state import RunState

    held_out = [Theorem(f"h{i}", "countdown", numbers=[1, 2], target=3) for i in range(2)]
    said: list[tuple[str, float | None]] = []
    sink = MetricsSink(tmp_path / "run")
    evaluations = Evaluations(held_out, sink, lambda line, took_s: said.append((line, took_s)))
    state = RunState("r")
    state.orders["es-v4-m0"] = _order("es-v4-m0", 4, [])
    for version, scores in ((0, [(0.1, "rejected"), (0.1, "rejected")]), (4, [(1.0, "proved"), (0.5, "rejected")])):
        order = eval_order(version, held_out)
        state.evals[order.work_id] = order
        for i, (value, verdict) in enumerate(scores):
            attempt = f"{order.work_id}:{i}:0"
            state.add(Reward(attempt, f"h{i}", version, verdict, value, work_id=order.work_id))  # type: ignore[arg-type]
        evaluations.collect(state)
    state.add(Reward("es-v4-m0:0:0", "t", 4, "proved", 1.0, work_id="es-v4-m0"))
    assert "by_theorem" not in state.orders["es-v4-m0"].to_dict()
    records = sink.records()
    assert [(r["version"], r["problem_rewards"], r["problems_solved"]) for r in records] == [
        (0, {"h0": 0.1, "h1": 0.1}, []),
        (4, {"h0": 1.0, "h1": 0.5}, ["h0"]),
    ]
    assert all(r["took_s"] >= 0 for r in records)
    assert state.eval_results[4] == {"version": 4, "held_out_reward": 0.75, "held_out_exact": 0.5, "problems": 2}
    assert [line for line, _ in said] == [
        "held-out v0: reward 0.100, 0/2 solved",
        "held-out v4: reward 0.750, 1/2 solved (+0.650 vs v0)",
    ]


def test_countdowns_credit_by_part_is_the_mean_over_the_attempts_used_and_kept_in_the_checkpoint_when_set():
    """Orders a (2 attempts) and b (1 attempt) with their parts summed as RunState.add sums them: format 1 + 1 | 1,
    expression 1 + 0 | 1, closeness 0.5 + 0 | 0.25. Means over 3 attempts: format 1, expression 2/3, closeness
    0.75 / 3 = 0.25. An order without parts (a Lean run, an older verifier) adds none."""
    a, b = _order("a", 5, [0.4, 0.1]), _order("b", 5, [0.575])
    for order, parts in (
        (a, {"format": 1.0, "expression": 1.0, "closeness": 0.5}),
        (a, {"format": 1.0}),
        (b, {"format": 1.0, "expression": 1.0, "closeness": 0.25, "note": "x"}),
    ):
        order.add_parts(parts)
    metrics = version_metrics(6, "es", 5, [a, b], [], 3, {}, 1.0)
    assert metrics["parts"] == {"format": 1.0, "expression": 0.666667, "closeness": 0.25}  # "note": not a figure
    assert "parts" not in version_metrics(6, "es", 5, [_order("c", 5, [1.0])], [], 1, {}, 1.0)
    assert Order.from_dict(a.to_dict()).parts == {"format": 2.0, "expression": 1.0, "closeness": 0.5}
    assert "parts" not in _order("c", 5, [1.0]).to_dict()  # the checkpoint's format unchanged without parts


def test_an_es_updates_member_spread_counts_the_members_that_differed():
    """Rewards 0.1 five times, 0.2 twice, 0.35 once: 3 distinct, the most common 0.1, 3 members differ from it."""
    members = [_order(f"m{i}", 5, [r]) for i, r in enumerate([0.1, 0.2, 0.1, 0.35, 0.1, 0.2, 0.1, 0.1])]
    assert member_spread(members) == {"members": 8, "distinct": 3, "mode": 0.1, "differed": 3, "min": 0.1, "max": 0.35}
    flat = member_spread([_order(f"m{i}", 5, [0.1, 0.1]) for i in range(4)])
    assert (flat["distinct"], flat["differed"]) == (1, 0)  # a step of zeros


def test_an_evaluations_result_has_its_held_out_credit_by_part():
    """Two held-out answers: one solved with tags (every part 1), one tagged expression with the wrong numbers
    (format 1, expression 1): means format 1, expression 1, numbers 0.5, closeness 0.5, solved 0.5."""
    done = Order("eval-v2", 2, 0, 1, ["t1", "t2"], rewards={"eval-v2:0:0": 1.0, "eval-v2:1:0": 0.2}, proved=1)
    done.add_parts({"format": 1.0, "expression": 1.0, "numbers": 1.0, "closeness": 1.0, "solved": 1.0})
    done.add_parts({"format": 1.0, "expression": 1.0, "numbers": 0.0, "closeness": 0.0, "solved": 0.0})
    assert eval_result(done) == {
        "version": 2,
        "held_out_reward": 0.6,
        "held_out_exact": 0.5,
        "problems": 2,
        "held_out_parts": {"format": 1.0, "expression": 1.0, "numbers": 0.5, "closeness": 0.5, "solved": 0.5},
    }


def test_the_trackers_log_the_credit_by_part_one_number_a_part():
    evaluation = {
        "eval": True,
        "version": 3,
        "held_out_reward": 0.2,
        "problems": 8,
        "time": 1.0,
        "held_out_parts": {"format": 0.5, "solved": 0.125},
        "problems_solved": ["p0"],
    }
    assert tracked(evaluation) == (
        {
            "eval/held_out_reward": 0.2,
            "eval/problems": 8.0,
            "eval/held_out_parts/format": 0.5,
            "eval/held_out_parts/solved": 0.125,
        },
        3,
    )
    update = {"version": 4, "reward_mean": 0.3, "parts": {"numbers": 0.25}, "member_spread": {"distinct": 2}}
    assert tracked(update) == ({"reward_mean": 0.3, "parts/numbers": 0.25, "member_spread/distinct": 2.0}, 4)

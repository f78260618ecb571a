"""trainer/result.py: a run's result from what the trainer keeps, with every figure worked out by hand."""

from __future__ import annotations

from trainer import result

SETTINGS = {
    "run": "r",
    "algo": "es",
    "task": "countdown",
    "model": None,
    "iterations": 8,
    "preset": "cpu",
    "population": None,
    "sigma": None,
    "alpha": 0.004,
    "batch": 16,
    "antithetic": True,
    "es_temperature": 0.0,
    "seed": 1,
    "held_out": 32,
    "max_new_tokens": 64,
    "eval_every": 4,
    "quorum": 1.0,
    "max_staleness": 2,
}
EVALS = {
    "0": {"held_out_reward": 0.09, "held_out_exact": 0.0, "problems": 32},
    "4": {"held_out_reward": 0.2, "held_out_exact": 0.09375, "problems": 32},
    "8": {"held_out_reward": 0.15, "held_out_exact": 0.0625, "problems": 32},
}


def test_the_held_out_first_last_and_best_with_the_problems_solved():
    h = result.held_out(EVALS)
    assert h["first"] == {"version": 0, "reward": 0.09, "exact": 0.0, "solved": 0, "problems": 32}
    assert (h["last"]["version"], h["last"]["solved"]) == (8, 2)  # 0.0625 of 32
    assert (h["best"]["version"], h["best"]["solved"], h["evaluations"]) == (4, 3, 3)  # 0.09375 of 32
    assert result.evaluation_line(h) == (
        "held-out reward 0.090 (v0) -> 0.150 (v8), best 0.200 (v4); exact 0/32 -> 2/32, best 3/32"
    )
    assert result.held_out({}) is None


def test_the_main_settings_fill_in_the_es_preset():
    shown = result.main_settings(SETTINGS)
    assert (shown["population"], shown["sigma"], shown["alpha"]) == (8, 0.001, 0.004)  # cpu's N and sigma; alpha set
    assert "lr" not in shown and shown["quorum"] == 1.0
    assert shown["es_noise"] == "full" and "es_rank" not in shown  # SETTINGS predates low-rank ES: full
    lowrank = result.main_settings({**SETTINGS, "es_noise": "lowrank", "es_rank": 4})
    assert (lowrank["es_noise"], lowrank["es_rank"]) == ("lowrank", 4)  # `ops compare` names what differs
    grpo = result.main_settings({**SETTINGS, "algo": "grpo", "group_size": 8, "lr": 1e-5})
    assert (grpo["group_size"], grpo["lr"]) == (8, 1e-5) and "population" not in grpo


def test_the_eta_is_the_versions_left_at_the_recent_pace_less_the_time_since_the_last():
    # updates 100 s apart; 5 of 8 done; 30 s since the last: 3 x 100 - 30
    times = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0]
    assert result.eta_s(5, 8, times, started=900.0, now=1430.0) == 270.0
    assert result.eta_s(1, 8, [1060.0], started=1000.0, now=1060.0) == 7 * 60.0  # the first interval from the start
    assert result.eta_s(0, 8, [], started=1000.0, now=1010.0) is None  # no update yet: nothing to go by
    assert result.eta_s(8, 8, times, started=900.0, now=2000.0) == 0.0
    # only the newest ETA_WINDOW intervals count: a slow start (1000 s) no longer weighs once 5 fast ones follow
    slow_start = [1000.0, 2000.0, 2010.0, 2020.0, 2030.0, 2040.0, 2050.0]
    assert result.eta_s(7, 8, slow_start, started=0.0, now=2050.0) == 10.0
    # the final evaluation comes after the last version: the newest evaluation took 95 s, so 270 + 95
    assert result.eta_s(5, 8, times, started=900.0, now=1430.0, eval_s=95.0) == 365.0
    assert result.eta_s(8, 8, times, started=900.0, now=2000.0, eval_s=95.0) == 95.0  # only the evaluation is left


def test_under_a_wall_clock_budget_the_eta_ends_one_version_after_the_budget_and_no_cap_is_said():
    # 100 s a version, 5 done at 1400, now 1430; 100000 versions left at that pace would be 115 days, but the
    # 45-minute budget from 900 ends at 3600: 2170 s left, plus the version under way then (100 s)
    times = [1000.0, 1100.0, 1200.0, 1300.0, 1400.0]
    assert result.eta_s(5, 100000, times, started=900.0, now=1430.0, ends_at=3600.0) == 2270.0
    assert result.eta_s(5, 100000, times, started=900.0, now=1430.0, eval_s=95.0, ends_at=3600.0) == 2365.0
    # past the budget: the version under way, then the evaluation
    assert result.eta_s(30, 100000, [3550.0, 3650.0], started=900.0, now=3700.0, eval_s=95.0, ends_at=3600.0) == 195.0
    # a budget beyond the versions left changes nothing
    assert result.eta_s(5, 8, times, started=900.0, now=1430.0, ends_at=90000.0) == 270.0
    budgeted = {**SETTINGS, "iterations": 100000, "max_minutes": 45}
    live = result.summary(
        budgeted, version=5, counts={}, evals=EVALS, status="live", started=900.0, update_times=times, now=1430.0
    )
    assert (live["eta_s"], live["max_minutes"]) == (2270.0, 45.0)
    assert result.progress(live) == "version 5 of a 45 min budget" and result.progress(live, short=True) == "5 (45 min)"
    assert "at version 5 of a 45 min budget (ES on countdown" in result.headline(live)
    plain = result.summary(SETTINGS, version=5, counts={}, evals=EVALS, status="finished", started=900.0, wall_s=9.0)
    assert plain["max_minutes"] is None
    assert (result.progress(plain), result.progress(plain, short=True)) == ("version 5 of 8", "5/8")


def test_a_live_summary_counts_its_wall_time_from_the_start_and_a_finished_one_keeps_its_own():
    live = result.summary(
        SETTINGS,
        version=5,
        counts={"samples": 640},
        evals=EVALS,
        status="live",
        started=900.0,
        update_times=[1000.0, 1100.0, 1200.0, 1300.0, 1400.0],
        now=1430.0,
    )
    assert (live["wall_s"], live["eta_s"], live["ended"], live["samples"]) == (530.0, 270.0, None, 640)
    done = result.summary(
        SETTINGS,
        version=8,
        counts={"samples": 1024},
        evals=EVALS,
        status="finished",
        started=900.0,
        wall_s=397.0,
        now=5000.0,
    )
    assert (done["wall_s"], done["eta_s"], done["ended"]) == (397.0, None, 1297.0)
    assert done["model"] == "SmolLM2-135M-Instruct (default)"
    assert result.headline(done) == (
        "run 'r' finished at version 8 of 8 (ES on countdown, SmolLM2-135M-Instruct "
        "(default), 6 min 37 s); held-out reward 0.090 (v0) -> 0.150 (v8), best 0.200 "
        "(v4); exact 0/32 -> 2/32, best 3/32; 1024 training samples"
    )
    assert ", ETA 4 min 30 s)" in result.headline(live)


def test_the_reading_says_what_countdowns_shaped_credit_means():
    text = result.reading("countdown")
    # independently of the checker's constants: a tagged "1 + 2" for other numbers, an untagged one, tags alone
    from tasks.countdown_check import check, partial_credit

    def score(answer: str) -> float:
        return partial_credit(answer, check([4, 5], 9, answer), 9)

    assert (score("<answer>1 + 2</answer>"), score("1 + 2 = 3"), score("<answer>nine</answer>")) == (0.2, 0.1, 0.1)
    assert (score("<answer>4 * 5</answer>"), score("<answer>5 - 4</answer>"), score("4 + 5")) == (0.5, 0.533333, 1.0)
    assert "<answer> tags 0.1, plus 0.1 for an expression, 0.3 more for the right numbers" in text
    assert "up to 0.3 more close to the target (at most 0.8), 1 solved" in text
    assert "so 0.1 is the tags alone or an expression without them" in text
    assert "reward and exact are the same measure" in result.reading("lean")
    assert result.reading(None) is None  # a run whose task was not kept gets no other task's reading
    assert [result.duration(s) for s in (None, 0.35, 41.4, 397, 7500)] == [
        "-",
        "350 ms",
        "41 s",
        "6 min 37 s",
        "2 h 05 min",
    ]


def test_a_run_that_ends_at_its_best_names_no_other_best():
    tied = {**EVALS, "8": {"held_out_reward": 0.2, "held_out_exact": 0.09375, "problems": 32}}  # v8 equals v4
    h = result.held_out(tied)
    assert h["best"]["version"] == 8
    assert result.evaluation_line(h) == "held-out reward 0.090 (v0) -> 0.200 (v8); exact 0/32 -> 3/32"


def test_the_prompt_format_is_the_one_applied_to_the_task():
    # the setting's default, kimina, is Lean's: a Countdown run asked in Countdown's first format, tinyzero
    assert result.prompt_format({"task": "countdown", "prompt_format": "kimina"}) == "tinyzero"
    assert result.prompt_format({"task": "countdown", "prompt_format": "equation"}) == "equation"
    assert result.prompt_format({"task": "lean", "prompt_format": "kimina"}) == "kimina"
    assert result.prompt_format({"task": "countdown"}) is None
    assert result.main_settings({**SETTINGS, "prompt_format": "kimina"})["prompt_format"] == "tinyzero"


def test_an_es_runs_samples_are_said_against_the_papers_budget():
    # the paper: 30 members x 200 problems x 500 iterations = 3,000,000 generations (arXiv 2509.24372)
    b = result.budget(1024)
    assert (b["paper_samples"], b["share"]) == (3_000_000, 0.00034133)  # 1024 / 3e6 = 0.000341333..., 8 places
    assert b["words"] == (
        "1,024 samples: 0.034% of the paper's 3M (population 30 x 200 problems x 500 iterations, Qiu et al. 2025)"
    )
    assert result.budget(204_800)["words"].startswith("204,800 samples: 6.8% of the paper's 3M")  # 6.8266...%
    assert result.budget(1_500_000)["words"].startswith("1,500,000 samples: 50% of")
    es = result.summary(SETTINGS, version=8, counts={"samples": 1024}, evals=EVALS, status="finished")
    grpo = result.summary(
        {**SETTINGS, "algo": "grpo"}, version=8, counts={"samples": 1024}, evals={}, status="finished"
    )
    assert es["budget"]["samples"] == 1024 and grpo["budget"] is None  # the paper's budget is ES's


def test_the_last_updates_member_spread_says_how_many_members_differed():
    # 8 members: five at 0.1, two at 0.2, one at 0.35 -> 3 distinct, 3 differ from the most common 0.1
    spread = {"members": 8, "distinct": 3, "mode": 0.1, "differed": 3, "min": 0.1, "max": 0.35}
    s = result.spread({"version": 6, "member_spread": spread})
    assert s["words"] == (
        "last update (v6): 3 of 8 members' rewards differed from the most common (0.100); 3 distinct, 0.100 to 0.350"
    )
    flat = {"members": 8, "distinct": 1, "mode": 0.1, "differed": 0, "min": 0.1, "max": 0.1}
    assert result.spread({"version": 6, "member_spread": flat})["words"] == (
        "last update (v6): all 8 members scored 0.100: no reward difference, so a step of zeros"
    )
    assert result.spread({"version": 6}) is None and result.spread(None) is None  # GRPO, or an older ES run


def test_the_credit_by_part_first_to_last_held_out_and_in_training():
    evals = {
        "0": {
            **EVALS["0"],
            "held_out_parts": {"format": 0.5, "expression": 0.25, "numbers": 0.1, "closeness": 0.05, "solved": 0.0},
        },
        "4": EVALS["4"],  # an evaluation without parts (a resumed older run) is passed over
        "8": {
            **EVALS["8"],
            "held_out_parts": {"format": 0.9, "expression": 0.6, "numbers": 0.3, "closeness": 0.2, "solved": 0.0625},
        },
    }
    update = {
        "version": 8,
        "parts": {"format": 0.75, "expression": 0.5, "numbers": 0.25, "closeness": 0.125, "solved": 0.1},
    }
    b = result.by_part(evals, update)
    assert b["held_out_words"] == (
        "held-out by part (v0 -> v8): format 0.500 -> 0.900, expression 0.250 -> 0.600, numbers 0.100 -> 0.300, "
        "closeness 0.050 -> 0.200, solved 0.000 -> 0.062"
    )
    assert b["training_words"] == (
        "training by part (v8): format 0.750, expression 0.500, numbers 0.250, closeness 0.125, solved 0.100"
    )
    assert result.by_part(EVALS, {"version": 8}) is None  # Lean, or a run from before parts were kept


def test_the_reward_scheme_is_a_main_setting_and_says_how_to_read_it():
    assert result.main_settings(SETTINGS)["reward"] == "shaped"  # a run from before the setting: shaped
    assert result.main_settings({**SETTINGS, "reward": "paper"})["reward"] == "paper"
    assert "reward" not in result.main_settings({**SETTINGS, "task": "lean"})
    paper = result.reading("countdown", "paper")
    assert "0.1 for an answer in <answer> tags, 1 solved, nothing between" in paper
    assert result.reading("countdown", "shaped") == result.reading("countdown")

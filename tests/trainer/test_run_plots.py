"""A run's own plots (trainer/run_plots.py): parts.png, Countdown's credit by part, is drawn where the metrics
carry parts and only there."""

from __future__ import annotations

from trainer.run_plots import draw

PARTS = {"format": 1.0, "expression": 0.5, "numbers": 0.25, "closeness": 0.1, "solved": 0.0}


def _update(version: int, **extra) -> dict:
    return {"version": version, "reward_mean": 0.2, "pass_rate": 0.0, "staleness": {"0": 4}} | extra


def _eval(version: int, **extra) -> dict:
    return {"version": version, "eval": True, "held_out_reward": 0.3, "held_out_exact": 0.1} | extra


def test_parts_are_drawn_where_the_records_carry_them(tmp_path):
    records = [_eval(0, held_out_parts=PARTS), _update(1, parts=PARTS), _update(2, parts=PARTS), _eval(2)]
    drawn = draw(tmp_path, records)
    assert [p.name for p in drawn] == ["reward.png", "staleness.png", "throughput.png", "parts.png"]
    assert (tmp_path / "parts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_parts_has_no_parts_plot(tmp_path):
    drawn = draw(tmp_path, [_eval(0), _update(1), _eval(1)])  # a Lean run: no credit by part
    assert [p.name for p in drawn] == ["reward.png", "staleness.png", "throughput.png"]
    assert not (tmp_path / "parts.png").exists()

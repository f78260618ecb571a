"""streams/run_dir.py: a run directory's files read as the trainer writes them."""

from __future__ import annotations

from streams import run_dir


def test_records_are_read_in_order_from_the_file_or_its_folder(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(
        b'{"version": 1, "reward_mean": 0.5}\n\n{"eval": true, "version": 1, "held_out_reward": 0.25}\n'
        b'{"version": 2, "reward_mean": 0.75}\n'
    )
    records = run_dir.read_records(tmp_path)
    assert records == run_dir.read_records(tmp_path / "metrics.jsonl")
    assert [r["version"] for r in run_dir.update_records(records)] == [1, 2]
    assert run_dir.eval_records(records) == [{"eval": True, "version": 1, "held_out_reward": 0.25}]
    assert run_dir.read_records(tmp_path / "elsewhere") == []


def test_a_folder_holds_a_run_by_any_of_its_three_files(tmp_path):
    assert not run_dir.holds_run(tmp_path)
    for name in ("run.json", "report.json", "metrics.jsonl"):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text("{}")
        assert run_dir.holds_run(folder)


def test_read_json_takes_objects_only(tmp_path):
    (tmp_path / "a.json").write_text('{"run": "r"}')
    (tmp_path / "b.json").write_text("[1, 2]")
    (tmp_path / "c.json").write_text("{not json")
    assert run_dir.read_json(tmp_path / "a.json") == {"run": "r"}
    assert run_dir.read_json(tmp_path / "b.json") is None
    assert run_dir.read_json(tmp_path / "c.json") is None
    assert run_dir.read_json(tmp_path / "missing.json") is None

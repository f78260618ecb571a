"""The GPU check: `python -m ops.gpu.check` (quick checks on a 2-layer model) and `--full` (full.py: the real
pipeline, the benches and the sharded trainer job, sharded_job.py, on the device), and the scripts that carry
it to an offline GPU box (pack.sh here, box.sh there)."""

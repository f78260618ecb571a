"""`python -m ops.gpu_check [--full]` (`make gpu-check`): do the engine and trainer paths run on a GPU
(ops/gpu/check.py; `--full`: ops/gpu/full.py)."""

from ops.gpu.check import main

if __name__ == "__main__":
    raise SystemExit(main())

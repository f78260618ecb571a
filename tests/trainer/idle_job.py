"""A sharded job whose rank 0 idles, then goes silent, for tests/trainer/test_sharded.py, run by torchrun:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tests.trainer.idle_job TIMEOUT_S SECONDS MARKER

with a process-group timeout of TIMEOUT_S: rank 0 is a Leader idle for SECONDS (its keepalive on), then
touches MARKER and goes silent (its keepalive off, no stop), while the others wait in `follow` throughout (no
model is loaded).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from trainer import sharded


def wait(timeout_s: str, seconds: str, marker: str) -> int:
    # Both ranks meet on torchrun's store (long timeout) first: on a loaded machine one may start seconds
    # after the other, and joining the process group counts against its short timeout.
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=120)
    )
    store.set(f"idle_job_ready_{rank}", "1")
    store.wait([f"idle_job_ready_{r}" for r in range(world)])
    mesh = sharded.start("cpu", timeout_s=float(timeout_s))
    if dist.get_rank() != 0:
        return sharded.follow(mesh, Path("/nonexistent"))  # no "init" comes: nothing is loaded
    lead = sharded.become_leader(mesh, float(timeout_s))
    time.sleep(float(seconds))  # rank 0 waiting for rollouts, outside any collective
    lead._closed.set()  # the keepalive stops: rank 0 as if stuck, with the others waiting on it
    Path(marker).touch()
    time.sleep(600)
    return 0


if __name__ == "__main__":
    raise SystemExit(wait(*sys.argv[1:4]))

"""Operations: what an operator runs beside the roles, in four rooms, and the commands that enter them.

    python -m ops COMMAND       ops/cli.py: the views of a run and `python -m ops bench NAME`
    python -m ops.health ROLE   ops/health.py: the roles' container health checks (ops/deploy/health.py)
    python -m ops.gpu_check     ops/gpu_check.py: the GPU check (ops/gpu/check.py, `--full`: ops/gpu/full.py)
    python -m ops.redis_sizing  ops/redis_sizing.py: Redis memory per attempt (ops/deploy/redis_sizing.py)

    ops/views/    the operator's views of a run: its result, streams, dead letters, verdicts, samples, the runs
                  of a folder side by side, the dashboard; live from Redis or from a finished run's directory
    ops/bench/    the benchmarks, the flags and ending they share, and the synthetic roles and REPL they run
    ops/gpu/      the GPU check, the sharded trainer job it runs, and what carries it to an offline GPU box
    ops/deploy/   deployment: the container images, docker_setup.sh, the Kubernetes manifests, the health checks,
                  Redis sizing, and the Lean box recipe (lean_box.sh: the Lean image built and checked end to end)

compose*.yaml stay at the repository's root, where compose looks for them.
"""

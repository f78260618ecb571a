"""`python -m ops.redis_sizing [--profile countdown|lean|grpo]`: Redis memory per attempt, measured with the real
wire (ops/deploy/redis_sizing.py)."""

from ops.deploy.redis_sizing import main

if __name__ == "__main__":
    raise SystemExit(main())

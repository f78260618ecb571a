"""Container health checks: `python -m ops.health generator|trainer` (exit 0 healthy, 1 not, with the reason).

Compose and Kubernetes run these inside the role's container. The verifier has its own:
`arq workers.verifier --check` (arq's health key, refreshed every 10 s by a live worker).

- generator: this container's generator has reported its figures to `{ps:R}:generator_stats` within
  `--max-age-s`. The report comes from the service's event loop, not the engine thread, so a long batch does
  not make it stale; a wedged loop or a lost Redis does. Matched by the consumer name: `$PROOFSTREAM_NAME`, or
  the default `gen-<hostname>-<pid>` for this container's hostname.
- trainer: the run's Redis answers (the trainer is a one-shot job: its progress is in `python -m ops`).

Settings as every role reads them: `PROOFSTREAM_REDIS_URL`, `PROOFSTREAM_RUN`, `PROOFSTREAM_NAME`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import orjson
import redis
from redis.exceptions import RedisError

from streams.keys import Keys


def check_generator(client: redis.Redis, keys: Keys, max_age_s: float, name: str = "") -> str | None:
    """None when a generator of this container reported recently; else why not."""
    reports = client.hgetall(keys.generator_stats)
    prefix = f"gen-{socket.gethostname()}-"
    ours = (lambda n: n == name) if name else (lambda n: n.startswith(prefix))
    mine = {k.decode(): v for k, v in reports.items() if ours(k.decode())}
    if not mine:
        return f"no report from {name or prefix + '*'} in {keys.generator_stats} yet"
    now_ms = time.time() * 1000
    age_s = min((now_ms - orjson.loads(v).get("reported_ms", 0)) / 1000 for v in mine.values())
    if age_s > max_age_s:
        return f"the last report of {', '.join(sorted(mine))} is {age_s:.0f} s old (limit {max_age_s:.0f} s)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.health", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["generator", "trainer"])
    parser.add_argument("--max-age-s", type=float, default=60.0, help="generator: oldest acceptable report")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="Redis connect and read timeout")
    args = parser.parse_args(argv)
    url = os.environ.get("PROOFSTREAM_REDIS_URL")
    if not url:
        print("unhealthy: PROOFSTREAM_REDIS_URL is not set", file=sys.stderr)
        return 1
    keys = Keys(os.environ.get("PROOFSTREAM_RUN", "default"))
    client = redis.Redis.from_url(url, socket_timeout=args.timeout_s, socket_connect_timeout=args.timeout_s)
    try:
        client.ping()
        problem = None
        if args.role == "generator":
            problem = check_generator(client, keys, args.max_age_s, os.environ.get("PROOFSTREAM_NAME", ""))
    except RedisError as e:  # the check's answer, not a crash: Redis unreachable means unhealthy
        problem = f"the run's Redis does not answer: {e}"  # no URL: it may hold a password
    finally:
        client.close()
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print("healthy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Container health checks: `python -m ops.health generator|verifier|trainer` (exit 0 healthy, 1 not, with the
reason).

Compose and Kubernetes run these inside the role's container.

- generator: this container's generator has reported its figures to `{ps:R}:generator_stats` within
  `--max-age-s`. The report comes from the service's event loop, not the engine thread, so a long batch does
  not make it stale; a wedged loop or a lost Redis does. Matched by the consumer name: `$PROOFSTREAM_NAME`, or
  the default `gen-<hostname>-<pid>` for this container's hostname.
- verifier: this container's verifier worker reported its figures to `{ps:R}:verifier_stats` within
  `--max-age-s` (the worker reports when its pool started and every 30 s), and none of its sandboxes is
  unavailable (`sandboxes_unavailable`: a sandbox that could not start, e.g. a missing image or interpreter).
  Such a worker stays up and retries its sandboxes, so it turns green by itself once they start. Matched by
  the worker id's hostname part (`<hostname>-<pid>-...`, consumers.service); the newest report counts.
  `arq workers.verifier --check` (arq's key, refreshed every 10 s) only says that the process polls Redis.
- trainer: the run's Redis answers, and the run is not stalled (`{ps:R}:trainer_alert`, set by a trainer
  whose run has made no progress while the infrastructure says why: trainer/progress.py).

`--liveness` (Kubernetes' livenessProbe, which restarts a container that fails it): only whether the role's
loop still turns, i.e. its report is fresh. Where the run's Redis does not answer it passes: every role rides
out an outage by itself (streams/ride_out.py), and a restart would bring no Redis back while it costs a
generator its loaded model and a verifier its started sandboxes. A verifier whose sandboxes cannot start
passes too (it retries them itself: that is readiness, the check without the flag). A role wedged during an
outage is therefore restarted only once Redis is back and its report is still stale.

Settings as every role reads them: `PROOFSTREAM_REDIS_URL`, `PROOFSTREAM_RUN`, `PROOFSTREAM_NAME`.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import orjson
import redis
import redis.exceptions as rx
from redis.exceptions import RedisError

from streams import role_stats
from streams.connect import connect_sync
from streams.keys import Keys
from streams.settings import DefaultsFormatter


def check_generator(client: redis.Redis, keys: Keys, max_age_s: float, name: str = "") -> str | None:
    """None when a generator of this container reported recently; else why not."""
    prefix = f"gen-{socket.gethostname()}-"
    ours = (lambda n: n == name) if name else (lambda n: n.startswith(prefix))
    mine = {n: report for n, report in role_stats.generators_sync(client, keys).items() if ours(n)}
    if not mine:
        return f"no report from {name or prefix + '*'} in {keys.generator_stats} yet"
    age_s = min(role_stats.age_s("generator", report) for report in mine.values())
    if age_s > max_age_s:
        return f"the last report of {', '.join(sorted(mine))} is {age_s:.0f} s old (limit {max_age_s:.0f} s)"
    return None


def check_verifier(client: redis.Redis, keys: Keys, max_age_s: float, sandboxes: bool = True) -> str | None:
    """None when the newest report of a verifier worker of this container is fresh and (unless `sandboxes`
    is False) all its sandboxes could start; else why not."""
    prefix = f"{socket.gethostname()}-"
    mine = [report for k, report in role_stats.verifiers_sync(client, keys).items() if k.startswith(prefix)]
    if not mine:
        return f"no report from a verifier worker {prefix}* in {keys.verifier_stats} yet"
    newest = min(mine, key=lambda report: role_stats.age_s("verifier", report))
    age_s = role_stats.age_s("verifier", newest)
    if age_s > max_age_s:
        return f"the last report of {newest.get('worker')} is {age_s:.0f} s old (limit {max_age_s:.0f} s)"
    down = newest.get("sandboxes_unavailable") or {}
    if down and sandboxes:
        first = next(iter(down))
        return f"{len(down)} sandbox(es) of {newest.get('worker')} cannot start; {first}: {down[first]}"
    return None


def check_trainer(client: redis.Redis, keys: Keys) -> str | None:
    """None unless the run's trainer says the run can make no progress, and why."""
    raw = client.get(keys.trainer_alert)
    return f"the run is stalled: {orjson.loads(raw)['cause']}" if raw else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.health", description=__doc__.split("\n\n")[0], formatter_class=DefaultsFormatter
    )
    parser.add_argument("role", choices=["generator", "verifier", "trainer"])
    parser.add_argument(
        "--max-age-s",
        type=float,
        default=None,
        help="generator, verifier: oldest acceptable report (default 60 s, verifier 90 s)",
    )
    parser.add_argument("--timeout-s", type=float, default=5.0, help="Redis connect and read timeout")
    parser.add_argument(
        "--liveness",
        action="store_true",
        help="only a stale report fails; an unanswering Redis or a sandbox that cannot start "
        "does not (the module docstring)",
    )
    args = parser.parse_args(argv)
    url = os.environ.get("PROOFSTREAM_REDIS_URL")
    if not url:
        print("unhealthy: PROOFSTREAM_REDIS_URL is not set", file=sys.stderr)
        return 1
    keys = Keys(os.environ.get("PROOFSTREAM_RUN", "default"))
    try:  # redis://, redis+sentinel:// or redis+cluster:// (streams.connect)
        client = connect_sync(url, socket_timeout=args.timeout_s, socket_connect_timeout=args.timeout_s)
    except ValueError as e:  # a scheme or a query redis-py does not know
        print(f"unhealthy: PROOFSTREAM_REDIS_URL cannot be used: {e}", file=sys.stderr)
        return 1
    except rx.AuthenticationError as e:
        print(f"unhealthy: the run's Redis refused the credentials: {e}", file=sys.stderr)
        return 1
    except RedisError as e:  # a cluster client asks its nodes for the slots as it starts
        return _unanswered(e, args.liveness)
    try:
        client.ping()
        problem = None
        if args.role == "generator":
            problem = check_generator(client, keys, args.max_age_s or 60.0, os.environ.get("PROOFSTREAM_NAME", ""))
        elif args.role == "verifier":  # it reports every 30 s: 90 s is two missed reports
            problem = check_verifier(client, keys, args.max_age_s or 90.0, sandboxes=not args.liveness)
        elif not args.liveness:  # a stalled run is a readiness matter: restarting the trainer fixes nothing
            problem = check_trainer(client, keys)
    except rx.AuthenticationError as e:  # a subclass of ConnectionError, but no outage: never healthy
        problem = f"the run's Redis refused the credentials: {e}"
    except (rx.ConnectionError, rx.TimeoutError) as e:  # the check's answer, not a crash (LOADING included)
        return _unanswered(e, args.liveness)
    except RedisError as e:  # a refused command (a missing ACL permission): never healthy
        problem = f"the run's Redis refused the check: {e}"
    finally:
        client.close()
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print("healthy")
    return 0


def _unanswered(error: Exception, liveness: bool) -> int:
    """The run's Redis does not answer (no URL in the message: it may hold a password)."""
    if liveness:
        print(
            f"healthy: the run's Redis does not answer ({error}); the role rides the outage out, and a "
            "restart would not end it",
            file=sys.stderr,
        )
        return 0
    print(f"unhealthy: the run's Redis does not answer: {error}", file=sys.stderr)
    return 1

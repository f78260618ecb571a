"""`python -m ops.health generator|verifier|trainer`: the roles' container health checks, as compose and
Kubernetes run them (ops/deploy/health.py says what each role's check asks)."""

from ops.deploy.health import main

if __name__ == "__main__":
    raise SystemExit(main())

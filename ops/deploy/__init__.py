"""Deployment: the container images (images/, built by images/build.sh; docker_setup.sh readies Docker and
the images for the tests), the Kubernetes manifests (k8s/), the roles' container health checks (health.py)
and Redis memory sizing (redis_sizing.py). compose*.yaml stay at the repository's root, where compose looks."""

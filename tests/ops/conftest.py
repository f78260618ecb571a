"""What every ops test shares."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def no_proofstream_env(monkeypatch):
    """The CLI reads PROOFSTREAM_* itself; a developer's own settings must not leak into the tests."""
    for name in list(os.environ):
        if name.startswith("PROOFSTREAM_"):
            monkeypatch.delenv(name)

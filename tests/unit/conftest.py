"""Unit tests never take the machine-wide server lock.

Stand-in servers (tests/unit/server/test_launcher.py) go through the real launcher, which holds
the lock for a server's life. Under `make test` the unit tests run next to the engine
tests (pytest-xdist), so a stand-in would wait for a real server, or a real server for a
stand-in. Each unit test gets a lock file of its own; tests of the lock set theirs.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_server_lock(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OFFLOAD_CHECK_LOCK", str(tmp_path_factory.mktemp("lock") / "server.lock"))

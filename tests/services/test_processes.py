"""The services' processes: ports for servers started side by side, and a service that dies at start."""

from __future__ import annotations

import os
import sys

import pytest

from services.layout import Services
from services.processes import free_port_env, free_ports, launch, running_pid, wait_http


def test_ports_asked_for_together_are_distinct_and_free():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    env = free_port_env()
    assert sorted(env) == ["NEXTLOC_MLFLOW_PORT", "NEXTLOC_PG_PORT", "NEXTLOC_PREFECT_PORT"]
    assert len(set(env.values())) == 3


def test_a_service_that_exits_at_start_is_named_at_once_not_waited_for(tmp_path):
    """A server that cannot start (its port taken, say) exits; the wait names it and its log instead of
    waiting out its time for an answer (the exited child was a zombie to ``kill(pid, 0)``)."""
    services = Services(tmp_path, 1, 2, 3, backend="sqlite", db_url=None)
    services.folder.mkdir()
    launch(services, "doomed", [sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    with pytest.raises(RuntimeError, match=r"^doomed exited; see .*doomed\.log$"):
        wait_http(services, "doomed", f"http://127.0.0.1:{free_ports(1)[0]}/health", timeout_s=600)
    assert running_pid(services, "doomed") is None

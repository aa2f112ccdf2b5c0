"""One tenant's CreateJob in a process of its own, for test_ctl_create_crash.py: a first job is
created, then a second one with every sqlite statement traced; with KILL_AT > 0 the process
kills itself (SIGKILL) as the database is about to run statement KILL_AT of that create. Prints
the number of statements the second create ran (when it was not killed).

    python create_crash_child.py DATABASE KILL_AT

The create runs through the service's CreateJob (quotas, owner, job manager, store) as over
gRPC, on a controller whose switch counts as read back (nothing is written to a switch before
a job is joined)."""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from homagg.api.credentials import hash_token
from homagg.control.config import parse_config
from homagg.control.jobs import JobManager
from homagg.control.service import ControllerService, pb
from homagg.control.store import Store

TENANT, TOKEN = "tenant-a", "tenant-a-token"


class Context:
    """What the service's CreateJob uses of a gRPC call's context."""

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {TOKEN}")]

    def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


def main() -> None:
    database, kill_at = Path(sys.argv[1]), int(sys.argv[2])
    doc = {
        "controller": {"database": str(database)},
        "switch": [
            {
                "name": "s1",
                "address": "127.0.0.1:1",
                "mac": "02:00:00:00:00:fe",
                "service_ip": "10.0.0.254",
            }
        ],
        "operator": [{"name": TENANT, "token_sha256": hash_token(TOKEN)}],
    }
    opened: list[sqlite3.Connection] = []
    connect = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(connect(*args, **kwargs))
        return opened[-1]

    sqlite3.connect = traced_connect  # type: ignore[assignment]
    manager = JobManager(parse_config(doc, database.parent), Store(database))
    with manager.lock:
        manager.switch_synced("s1", [])  # as if the switch had been read back
    service = ControllerService(manager, "crash-test")
    request = pb.CreateJobRequest(name="job", world_size=2, codec="dense", pool_size=8)
    service.CreateJob(request, Context())
    statements = 0

    def trace(statement: str) -> None:
        nonlocal statements
        statements += 1
        if statements == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    for db in opened:
        db.set_trace_callback(trace)
    service.CreateJob(request, Context())
    print(statements)
    manager.store.close()


if __name__ == "__main__":
    main()

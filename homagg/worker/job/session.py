"""The life of a job that `homagg.attach` or the homagg backend set up: each rank leaves it
(rank 0 also releases a job it created) when its process group is destroyed, or at exit
if the script never destroys it; after a crash the controller's lease ends it.

`dist.destroy_process_group` has no hook of its own, so the first session wraps it (once
per process) to close the sessions of the groups it destroys before torch tears them down;
one atexit handler closes whatever is still open. Closed sessions are forgotten, so
repeated set-ups in one process keep nothing alive."""

from __future__ import annotations

import atexit
import functools
import logging
import threading
from typing import Any

import torch.distributed as dist

from homagg.api.client import Release, release_job

log = logging.getLogger(__name__)

_sessions: list[JobSession] = []
_lock = threading.Lock()


class JobSession:
    """What one set-up holds: the agent, the job rank 0 created (if any), the hook state
    using them, and the process group whose destruction ends it (None: the world's)."""

    def __init__(
        self,
        agent: Any,
        job_id: int,
        release: Release | None,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.agent, self.job_id, self.release, self.group = agent, job_id, release, group
        self.states: list[Any] = []  # hook states to tell (and stop) when the job ends
        self.closed = False
        with _lock:
            _sessions.append(self)
        _install_destroy_hook()

    def close(self, why: str = "the process group was destroyed") -> None:
        """Stop the hook states' threads, leave the job and release it (rank 0, if it
        created it); idempotent."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            if self in _sessions:
                _sessions.remove(self)
        for state in self.states:
            state.close()
            state.agent, state.unavailable_reason = None, why
            state.warned = True  # a use after this is the script's, not a switch failure
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.release is not None:
            problem = release_job(self.release, self.job_id)
            if problem:
                log.warning("job %d not released (%s); its lease ends it", self.job_id, problem)


def close_sessions(group: dist.ProcessGroup | None = None) -> None:
    """Close the sessions of `group` (None or WORLD: every session)."""
    everything = group is None or group is dist.GroupMember.WORLD
    with _lock:
        chosen = [s for s in _sessions if everything or s.group is group]
    for s in chosen:
        s.close()


def _close_all_at_exit() -> None:
    close_sessions(None)


atexit.register(_close_all_at_exit)


def _install_destroy_hook() -> None:
    """Make dist.destroy_process_group close the sessions of the groups it destroys."""
    c10d = dist.distributed_c10d
    if getattr(c10d.destroy_process_group, "_homagg", False):
        return
    original = c10d.destroy_process_group

    @functools.wraps(original)
    def destroy_process_group(group: dist.ProcessGroup | None = None) -> None:
        close_sessions(group)
        original(group)

    destroy_process_group._homagg = True  # type: ignore[attr-defined]
    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group

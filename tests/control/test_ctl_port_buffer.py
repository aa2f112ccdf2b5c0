"""One switch port's buffer, shared by every job with a rank on it (`port_buffer`): the
controller refuses a rank whose pool would overrun its port, shrinks a pool to the headroom
when its first rank joins, gives the headroom back when a job ends, and restores the
accounting from its database after a restart. A JobManager without a switch process
(installs wait for a switch that never comes: the accounting needs none)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from homagg.api.errors import ResourceExhausted
from homagg.control.config import ConfigError, parse_config
from homagg.control.jobs import JobManager
from homagg.control.store import Store
from homagg.control.text_table import render_pools
from homagg.control.views import port_buffer_views

PORT_BUFFER = 40


def config_doc(tmp_path: Path, **switch: Any) -> dict[str, Any]:
    return {
        "controller": {"database": str(tmp_path / "controller.db")},
        "switch": [
            {
                "name": "s1",
                "address": "127.0.0.1:1",  # never reached
                "mac": "02:00:00:00:00:fe",
                "service_ip": "10.0.0.254",
                **switch,
            }
        ],
    }


def manager(tmp_path: Path, **switch: Any) -> JobManager:
    doc = config_doc(tmp_path, **({"port_buffer": PORT_BUFFER} | switch))
    m = JobManager(parse_config(doc, tmp_path), Store(tmp_path / "controller.db"))
    with m.lock:
        m.switch_synced("s1", [])  # as if the switch had been read back
    return m


@pytest.fixture
def m(tmp_path: Path) -> Iterator[JobManager]:
    yield manager(tmp_path)


def join(m: JobManager, job: Any, token: str, rank: int, port: int) -> None:
    """Rank `rank` from host 10.0.0.<rank + 1 + 10 * port>, on switch port `port` (a UDP port
    per job: ranks of two jobs on one host)."""
    ip, mac = f"10.0.0.{rank + 1 + 10 * port}", f"02:00:00:00:{port:02x}:{rank + 1:02x}"
    m.join(job.job_id, token, rank, mac, ip, 41000 + job.job_id, port)


def headroom(m: JobManager) -> dict[int, tuple[int, int, int]]:
    return {b.port: (b.used, b.headroom, b.jobs) for b in port_buffer_views(m)}


def test_ranks_on_one_port_share_its_buffer_and_an_overrun_is_refused(m):
    a, ta = m.create("a", 2, "dense", 16)
    join(m, a, ta, 0, 1)
    join(m, a, ta, 1, 2)
    b, tb = m.create("b", 2, "dense", 16)
    join(m, b, tb, 0, 1)
    join(m, b, tb, 1, 3)
    assert headroom(m) == {1: (32, 8, 2), 2: (16, 24, 1), 3: (16, 24, 1)}
    c, tc = m.create("c", 2, "dense", 16)
    join(m, c, tc, 0, 2)  # port 2 has room for 24
    with pytest.raises(ResourceExhausted, match=r"s1 port 1 .* room for 8 .* port_buffer 40"):
        join(m, c, tc, 1, 1)  # its pool is fixed once a rank joined: 16 > 8
    assert m.jobs[c.job_id].workers.keys() == {0}  # the refused join changed nothing
    assert headroom(m)[1] == (32, 8, 2)


def test_the_first_rank_shrinks_the_pool_to_its_ports_headroom(m):
    a, ta = m.create("a", 1, "dense", 30)
    join(m, a, ta, 0, 5)
    b, tb = m.create("b", 2, "dense", 30)
    base = m.jobs[b.job_id].pool_base
    join(m, b, tb, 0, 5)  # 10 left on port 5: granted as max_pool_size caps a request
    assert m.jobs[b.job_id].pool_size == 10 and m.jobs[b.job_id].pool_base == base
    assert m.switches["s1"].pools.used_ranges()[-1] == (base, 10)  # the rest given back
    assert headroom(m)[5] == (40, 0, 2)
    c, tc = m.create("c", 1, "dense", 4)
    with pytest.raises(ResourceExhausted, match=r"port 5 .* room for 0"):
        join(m, c, tc, 0, 5)  # nothing to shrink to
    assert m.jobs[c.job_id].pool_size == 4


def test_a_job_that_ends_or_a_rank_that_unjoins_gives_the_headroom_back(m):
    a, ta = m.create("a", 1, "dense", 40)
    join(m, a, ta, 0, 1)
    b, tb = m.create("b", 2, "dense", 8)
    with pytest.raises(ResourceExhausted):
        join(m, b, tb, 0, 1)
    join(m, b, tb, 1, 2)
    assert m.leave(b.job_id, tb, 1) is False  # un-joins: the job is not complete
    assert m.leave(a.job_id, ta, 0) is True  # its only rank left: the job ended
    assert headroom(m) == {}
    join(m, b, tb, 0, 1)
    assert headroom(m) == {1: (8, 32, 1)}


def test_a_restarted_controller_restores_the_accounting(tmp_path):
    first = manager(tmp_path)
    a, ta = first.create("a", 2, "dense", 24)
    join(first, a, ta, 0, 1)
    join(first, a, ta, 1, 2)
    first.stop()
    again = manager(tmp_path)
    assert headroom(again) == {1: (24, 16, 1), 2: (24, 16, 1)}
    b, tb = again.create("b", 1, "dense", 24)
    join(again, b, tb, 0, 1)  # shrunk to the 16 left, as before the restart
    assert again.jobs[b.job_id].pool_size == 16
    again.stop()


def test_aggctl_pools_shows_each_ports_headroom(m):
    a, ta = m.create("a", 1, "dense", 10)
    join(m, a, ta, 0, 3)
    text = render_pools([], port_buffer_views(m))
    head = "SWITCH  PORT  JOBS  IN FLIGHT  PORT BUFFER  HEADROOM"
    assert text.splitlines()[-2] == head
    assert text.splitlines()[-1].split() == ["s1", "3", "1", "10", "40", "30"]


def test_port_buffer_defaults_to_max_pool_size_and_is_checked(tmp_path):
    assert parse_config(config_doc(tmp_path), tmp_path).switches[0].port_buffer == 4096
    doc = config_doc(tmp_path, max_pool_size=1024)
    assert parse_config(doc, tmp_path).switches[0].port_buffer == 1024
    for bad in (0, -1, 1 << 21):
        with pytest.raises(ConfigError, match="port_buffer"):
            parse_config(config_doc(tmp_path, port_buffer=bad), tmp_path)

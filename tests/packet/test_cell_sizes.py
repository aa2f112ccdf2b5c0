"""The program built for every other cells-per-packet setting (CELLS_CHOICES): rounds of
full-range cells for an adding and a non-adding op, a resend, and frames of the wrong size
(counted drops), on each target whose switch builds the setting itself. The reference
switch and the eBPF target take it from HOMAGG_CELLS_PER_PKT (the eBPF object is compiled
per setting, homagg/ebpf/build.py); both are pushed the same P4Info (it does not depend on
the setting) and no device config, which they check but do not execute. BMv2 executes the
JSON p4c compiles for one setting: `python -m bench.switch_rate --cells` builds those."""

from __future__ import annotations

import ipaddress
import zlib

import numpy as np
import pytest

from homagg.control.artifacts import P4INFO_PATH
from homagg.environment import CELLS_PER_PKT_ENV
from homagg.lab.aggjob import CounterDelta, Job, random_cells, wrapped_sum
from homagg.lab.fabric import SERVICE_IP, SWITCH_MAC, Fabric
from homagg.lab.poll import wait_for
from homagg.wire.constants import (
    AGG_UDP_PORT,
    CELLS_CHOICES,
    CELLS_PER_PKT,
    ETHERTYPE_IPV4,
    IP_PROTO_UDP,
    WORKER_UDP_BASE,
    DropReason,
    Event,
    Flag,
    Op,
)
from homagg.wire.frame import (
    ETH_STRUCT,
    HOST_TTL,
    IPV4_FLAG_DONT_FRAGMENT,
    UDP_STRUCT,
    ipv4_checksum,
    mac_bytes,
    pack_ipv4,
)
from homagg.wire.header import AggHeader, header_view
from homagg.wire.packer import pack_payloads

OTHER_CELLS = [c for c in CELLS_CHOICES if c != CELLS_PER_PKT]
# The eBPF target compiles an object per setting: every one runs. The reference switch's
# code is one for all settings: the one that is no power of two runs.
SIZES_RUN = {"ebpf": OTHER_CELLS, "refswitch": [c for c in OTHER_CELLS if c == 48]}
HEADERS = 14 + 20 + 8  # Ethernet, IPv4, UDP: the aggregation header follows
WAIT = 3.0


@pytest.fixture(scope="module")
def fabric(target, tmp_path_factory):
    if target not in ("refswitch", "ebpf"):
        pytest.skip(
            f"{target} executes a JSON compiled per setting (a p4c run each): "
            "`python -m bench.switch_rate --cells` builds and measures them"
        )
    with Fabric(target, 3, tmp_path_factory.mktemp(target)) as f:
        yield f


@pytest.fixture
def sized(fabric, cells, tmp_path) -> Job:
    """The fabric's switch restarted for `cells` cells a packet, with a 3-rank job."""
    if cells not in SIZES_RUN[fabric.target]:
        pytest.skip(f"{fabric.target} runs {SIZES_RUN[fabric.target]} cells a packet here")
    fabric.restart_switch(env={CELLS_PER_PKT_ENV: str(cells)})
    no_config = tmp_path / "no_device_config"
    no_config.write_bytes(b"")
    fabric.load_program((P4INFO_PATH, no_config))
    return Job(fabric, fabric.hosts, pool_size=4)


def frame(job: Job, rank: int, cells: np.ndarray, ncells: int = 0, **fields: int) -> bytes:
    """Rank's contribution of len(cells) cells (ncells: the header's count, default the
    same; fields: slot, chunk, op), lengths and IPv4 checksum right for that size."""
    h = job.hosts[rank]
    kw = {"slot": 0, "shadow": 0, "op": Op.ADD, "chunk": 0, **fields}
    header = AggHeader(job_id=job.job_id, rank=rank, ncells=ncells or len(cells), **kw)
    payload = pack_payloads(header.to_record(), cells.reshape(1, -1))[0].tobytes()
    src, dst = (int(ipaddress.IPv4Address(a)) for a in (h.ip, SERVICE_IP))

    def ipv4(check: int) -> bytes:
        length, flags = 20 + 8 + len(payload), IPV4_FLAG_DONT_FRAGMENT
        return pack_ipv4(4, 5, 0, length, 0, flags, 0, HOST_TTL, IP_PROTO_UDP, check, src, dst)

    return (
        ETH_STRUCT.pack(mac_bytes(SWITCH_MAC), mac_bytes(h.mac), ETHERTYPE_IPV4)
        + ipv4(ipv4_checksum(ipv4(0)))
        + UDP_STRUCT.pack(WORKER_UDP_BASE + rank, AGG_UDP_PORT, 8 + len(payload), 0)
        + payload
    )


def results(job: Job, ranks: list[int], cells: int) -> dict[int, list[tuple[int, np.ndarray]]]:
    """Per rank, the (flags, cells) of the results that reached its host."""
    out = {}
    for r in ranks:
        got = job.hosts[r].raw.receive(WAIT, count=1)
        out[r] = [
            (
                int(header_view(np.frombuffer(f[HEADERS:], np.uint8).copy())["flags"][0]),
                np.frombuffer(f, ">i4", cells, HEADERS + 16).astype(np.int32),
            )
            for f in got
        ]
    return out


@pytest.mark.parametrize("cells", OTHER_CELLS)
def test_program_of_every_cell_size(sized: Job, cells: int) -> None:
    job, ranks = sized, [0, 1, 2]
    rng = np.random.default_rng(zlib.crc32(f"cells{cells}".encode()))
    delta = CounterDelta(job.fabric)
    parts = {}
    for chunk, op in enumerate((Op.ADD, Op.MAX)):
        parts[op] = [random_cells(rng)[:cells] for _ in ranks]
        for r in ranks:
            job.hosts[r].raw.send(frame(job, r, parts[op][r], slot=chunk, chunk=chunk, op=op))
        want = wrapped_sum(parts[op]) if op == Op.ADD else np.max(parts[op], axis=0)
        for r, got in results(job, ranks, cells).items():
            assert len(got) == 1 and got[0][0] == Flag.RESULT, (cells, op, r)
            assert np.array_equal(got[0][1], want), (cells, op, r)
    job.hosts[2].raw.send(frame(job, 2, parts[Op.MAX][2], slot=1, chunk=1, op=Op.MAX))
    (resent,) = results(job, [2], cells)[2]
    assert resent[0] == Flag.RESULT | Flag.RETX
    assert np.array_equal(resent[1], np.max(parts[Op.MAX], axis=0))
    job.hosts[0].raw.send(frame(job, 0, random_cells(rng), slot=2, chunk=2))  # default size
    job.hosts[0].raw.send(frame(job, 0, parts[Op.ADD][0], ncells=cells + 1, slot=2, chunk=2))
    job.hosts[0].raw.send(frame(job, 0, parts[Op.ADD][0])[: -4 * (cells // 2)])
    dropped = {DropReason.BAD_LENGTH: 2, DropReason.TRUNCATED: 1}
    wait_for(lambda: delta.drops() == dropped, WAIT, f"drops {dropped}")
    assert all(not job.hosts[r].raw.receive(0.02) for r in ranks)
    assert delta.events() == {Event.CONTRIBUTION: 6, Event.RESULT: 2, Event.RESENT: 1}

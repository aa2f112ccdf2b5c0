"""run.train tears gloo down at destroy_process_group, not at interpreter exit: after its
main() returns, no thread of gloo (pt_gloo_runloop, gloo_tcp_loop) or of the TCPStore
(pt_tcpstore_uv) is left. Issue 31: DDP imports torch.distributed.nn, whose functions keep
the world group as a default argument when imported after init_process_group; gloo was then
destroyed inside interpreter finalization, where a rank once aborted with "terminate called
without an active exception". One rank (world size 1) on loopback, no root needed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# run.train's main, then the names of the threads this process still has
# (a stopped thread may take a moment to leave /proc: looked at for up to 2 s)
RANK = """
import os, sys, time
from run import train
train.main(sys.argv[1:])
def names():
    out = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                out.append(f.read().strip())
        except FileNotFoundError:
            pass
    return sorted(out)
deadline = time.monotonic() + 2.0
while any("gloo" in n or "tcpstore" in n for n in names()) and time.monotonic() < deadline:
    time.sleep(0.05)
print("threads after main:", ",".join(names()), flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gloo_is_torn_down_before_the_interpreter_exits(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    argv = ["--mode", "gloo", "--steps", "2", "--users", "200", "--items", "50"]
    argv += ["--iface", "lo", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-c", RANK, *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "terminate called" not in done.stderr, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("threads after main:"))
    left = [n for n in line.split(":", 1)[1].strip().split(",") if "gloo" in n or "tcpstore" in n]
    assert left == [], line
    assert (tmp_path / "gloo.pt").exists()

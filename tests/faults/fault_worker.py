"""One rank as its own process (run by test_fault_worker_killed.py, killed there by PID):
joins a job through the agent with its UDP socket in a host namespace, then aggregates
the rounds of fault_net.round_parts, checking each sum; `--rounds 0` runs until killed.
Exit 0 when every sum was exact, 1 otherwise (the message on stderr)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from fault_net import expected_sum, round_parts, socket_factory

from homagg.wire.constants import Op
from homagg.worker.job.agent import AgentConfig, WorkerAgent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="AgentConfig fields as JSON")
    ap.add_argument("--netns", required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--cells", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--ready-file", required=True)
    args = ap.parse_args()
    cfg = AgentConfig(**json.loads(args.config))
    with WorkerAgent(cfg, socket_factory(args.netns)) as agent:
        Path(args.ready_file).write_text("ready")
        k = 0
        while args.rounds == 0 or k < args.rounds:
            parts = round_parts(k, args.world, args.cells)
            got = agent.transport.allreduce(Op.ADD, parts[cfg.rank])
            if not np.array_equal(got, expected_sum(parts)):
                print(f"round {k}: wrong sum", file=sys.stderr)
                return 1
            k += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

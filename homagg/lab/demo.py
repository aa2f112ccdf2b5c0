"""Demo of the data plane: hosts in namespaces aggregate through the switch.

Builds a fabric (BMv2 when installed, the reference switch otherwise), installs one job
over every host, runs rounds of random int32 contributions through the job's pool of slots,
checks every sum against numpy and prints rates and the switch's counters.
Run as root: python -m homagg.lab.demo --hosts 4 --rounds 200
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from homagg.lab.aggjob import CounterDelta, Job, random_cells, result_cells, wrapped_sum
from homagg.lab.fabric import Fabric
from homagg.lab.namespace import have_privileges
from homagg.lab.switch_process import AUTO_TARGET, resolve_target
from homagg.wire.constants import Event
from homagg.wire.scapy_layer import Agg  # noqa: F401  (binds the layer for result parsing)


def run(target: str, hosts: int, rounds: int, pool_size: int) -> int:
    """Run the demo; returns the number of wrong or missing results."""
    rng = np.random.default_rng(0)
    print(f"starting {target} with {hosts} hosts in network namespaces ...", flush=True)
    with Fabric(target, hosts) as fabric:
        job = Job(fabric, fabric.hosts, pool_size=pool_size)
        counters = CounterDelta(fabric)
        errors = 0
        start = time.monotonic()
        for k in range(rounds):
            parts = [random_cells(rng) for _ in range(hosts)]
            for r, part in enumerate(parts):
                job.send(r, part, slot=k % pool_size, shadow=(k // pool_size) % 2, chunk=k)
            expected = wrapped_sum(parts)
            for pkts in job.collect().values():
                if len(pkts) != 1 or not np.array_equal(result_cells(pkts[0]), expected):
                    errors += 1
            if (k + 1) % max(1, rounds // 10) == 0:
                rate = (k + 1) / (time.monotonic() - start)
                print(
                    f"  round {k + 1}/{rounds}: {rate:.0f} rounds/s, wrong results {errors}",
                    flush=True,
                )
        events = counters.events()
        print(
            f"\n{rounds} rounds x {hosts} workers on {target}: "
            f"{events.get(Event.CONTRIBUTION, 0)} contributions, "
            f"{events.get(Event.RESULT, 0)} results multicast, wrong or missing: {errors}"
        )
        print(f"drops by reason: {counters.drops() or 'none'}")
        return errors


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m homagg.lab.demo --hosts 4 --rounds 200",
    )
    p.add_argument(
        "--target",
        choices=[AUTO_TARGET, "refswitch", "bmv2", "ebpf"],
        default=AUTO_TARGET,
        help="switch to run (auto: BMv2 when simple_switch_grpc is installed)",
    )
    p.add_argument("--hosts", type=int, default=4, help="workers, one per host (default 4)")
    p.add_argument("--rounds", type=int, default=200, help="aggregation rounds (default 200)")
    p.add_argument("--pool-size", type=int, default=8, help="slots of the job's pool (default 8)")
    args = p.parse_args(argv)
    if not have_privileges():
        print("the demo needs root and iproute2 to create network namespaces", file=sys.stderr)
        return 2
    return 1 if run(resolve_target(args.target), args.hosts, args.rounds, args.pool_size) else 0


if __name__ == "__main__":
    sys.exit(main())

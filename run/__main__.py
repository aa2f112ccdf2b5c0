"""make run: Mininet with one P4 switch (BMv2 when installed, else the reference switch) and
N hosts, the controller on a host of the topology, then a torchrun job (one rank per host)
whose gradients the switch sums with a homomorphic codec, then the same job over gloo; a
summary table, the switch counters, a PNG plot, and the two runs' parameters compared.
With --script, your own torchrun script instead of make run's model (run/script.py).

Run as root. Example: python -m run --hosts 2 --steps 20 --target refswitch --bw 100
Your script: python -m run --script examples/train_ddp.py --script-args="--steps 40"
Exit status: 0 done (and the final parameters agree, or were not compared), 1 done but
the parameters differ beyond the fixed-point bound, 2 bad options or not root, 3 a run
failed (the reason is printed; nothing is left running), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from run import jobs, options, out_dir
from run.control import controller_address, controller_process, metrics_url
from run.credentials import RunCredentials, make_run_credentials
from run.names import RunNames
from run.report import print_report, print_script_report
from run.state import RunState, netns_id, pids_in_netns

if TYPE_CHECKING:
    from mininet.net import Mininet

    from homagg.lab.controller_process import ControllerProcess
    from run.net import Topology


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class _Session:
    """What a run has started so far, for teardown (also after errors and Ctrl-C)."""

    state: RunState
    net: Mininet | None = None
    ctl: ControllerProcess | None = None
    creds: RunCredentials | None = None


def _prepare_out(args: argparse.Namespace, names: RunNames) -> None:
    """The output directory (by default the run's own), emptied of an earlier run's files;
    absolute, since the ranks start in their hosts' own working directories."""
    own = args.out is None
    args.out = names.directory / "out" if own else args.out.resolve()
    out_dir.prepare(args.out, own=own)


def _build(session: _Session, topo: Topology, target: str, out: Path, pool_size: int) -> None:
    """Mininet with the switch, the hosts prepared, the controller up and synced (its
    default pool `pool_size`: the run's job's, a --script's too)."""
    from run.net import build, prepare_hosts

    names = session.state.names
    session.net = net = build(topo, target, out, names)
    for h in (*net.hosts, *net.switches):  # the switch has a namespace of its own too
        if h.inNamespace:
            session.state.add("netns", netns_id(h.pid))
        session.state.add("pgids", h.pid)
    net.start()
    for sw in net.switches:
        session.state.add("pgids", sw.process.proc.pid)
    prepare_hosts(net, sys.executable, names)
    session.creds = make_run_credentials(names.credentials_dir, names.controller_ip)
    session.ctl = ctl = controller_process(net, topo, out, names, session.creds, pool_size)
    session.state.add("pgids", ctl.launch())
    ctl.wait_synced().close()
    print(
        f"controller on {controller_address(names)} (host {names.controller_host}), switch "
        f"P4Runtime on {', '.join(sw.process.address for sw in net.switches)}, controller "
        "metrics at "
        f"{metrics_url(names)}; logs in {out}",
        flush=True,
    )


def _teardown(session: _Session) -> None:
    """Stop the controller, every process in the hosts' namespaces and Mininet."""
    ctl, net = session.ctl, session.net
    if ctl is not None:
        ctl.stop()
    if net is not None:
        for h in net.hosts:  # stragglers would keep a host's namespace alive
            if h.inNamespace:
                for pid in pids_in_netns(netns_id(h.pid)):
                    if pid != h.pid:
                        os.kill(pid, signal.SIGKILL)
        net.stop()
    session.state.clear()


def _first_line(args: argparse.Namespace, topo: Topology, target: str, number: int) -> str:
    """What the run is: its number, the switch target that runs, the job, the network."""
    job = (
        f"script {args.script}" + (f" {args.script_args}" if args.script_args else "")
        if args.script is not None
        else f"model {args.model}"
    )
    codec = f"codec {args.codec}{''.join(f' {kv}' for kv in args.codec_option)}"
    shape = f"overlap {args.overlap}, " if args.script is None else ""
    steps = f", {args.steps} steps" if args.script is None else ""
    steps += f", pool {args.pool_size}"
    return (
        f"make run: run {number} on {options.describe_target(args.target, target)}, "
        f"{topo.hosts} hosts, {job}, {codec}, {shape}links {topo.describe_bw()}{steps} "
        f"(stop it with `make stop RUN={number}`)"
    )


def run(args: argparse.Namespace) -> int:
    """Build, train twice, report, and tear everything down (also on errors and Ctrl-C)."""
    target, topo = options.settle(args)
    session = _Session(RunState.claim())
    names = session.state.names
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:  # the claimed run number is released in _teardown, whatever fails
        _prepare_out(args, names)
        print(_first_line(args, topo, target, names.number), flush=True)
        _build(session, topo, target, args.out, args.pool_size)
        assert session.net is not None and session.creds is not None
        counters, traffic = jobs.run_all(session.net, args, session.state, session.creds)
        if args.script is not None:
            return print_script_report(args, topo, target, counters, traffic)
        return print_report(args, topo, target, counters)
    finally:
        _teardown(session)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    description, epilog = __doc__.split("\n\n")[:2]
    parser = options.parser(description, epilog)
    args = parser.parse_args(argv)
    options.check_codec_rules(parser, args)
    if os.geteuid() != 0:
        print("make run needs root (Mininet, network namespaces)", file=sys.stderr)
        return 2
    if args.out is not None:
        try:
            out_dir.check(args.out)
        except out_dir.OutDirError as exc:
            print(f"make run: {exc}", file=sys.stderr)
            return 2
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: everything was stopped and removed", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
        print(f"make run failed: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

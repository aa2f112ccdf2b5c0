"""make run: Mininet with one P4 switch (BMv2 when installed, else the reference switch) and
N hosts, the controller on a host of the topology, then a torchrun job (one rank per host)
whose gradients the switch sums with a homomorphic codec, then the same job over gloo; a
summary table, the switch counters, a PNG plot, and the two runs' parameters compared.

Run as root. Example: python -m run --hosts 2 --steps 20 --target refswitch --bw 100
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from controller.config import DEFAULT_PORT
from run.credentials import RunCredentials, make_run_credentials
from run.model import DEFAULT_LR, MODELS
from run.names import RunNames
from run.peers import PEERS
from run.state import RunState, netns_id, pids_in_netns
from testnet.addresses import host_switch_port
from testnet.switch_process import BMV2_OPT_ENV, TARGETS, bmv2_available, target_problem
from worker.codecs import CODECS, DEFAULT_CODEC, is_exact

if TYPE_CHECKING:
    from mininet.net import Mininet

    from run.net import Topology
    from testnet.controller_process import ControllerProcess

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
CONTROLLER_PORT = DEFAULT_PORT


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m run",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--hosts", type=int, default=None, help="worker hosts, one rank each (default 4)"
    )
    p.add_argument(
        "--target",
        choices=["auto", *TARGETS],
        default="auto",
        help="switch (auto: BMv2 when simple_switch_grpc is installed; bmv2-opt: the "
        "optimized BMv2 build under --bmv2-opt, docs/bmv2.md)",
    )
    p.add_argument(
        "--bmv2-opt",
        type=Path,
        default=None,
        metavar="PREFIX",
        help=f"install prefix of the optimized BMv2 build (--target bmv2-opt; default: "
        f"${BMV2_OPT_ENV})",
    )
    p.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        choices=[*CODECS, "auto"],
        help=f"homomorphic codec of the switch run (default {DEFAULT_CODEC}); auto: the path "
        "and codec chosen per bucket and step from measured costs (asynchronous hook or DeAR)",
    )
    p.add_argument(
        "--codec-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the switch run's codec, repeatable (e.g. gamma=0: lowbit8 "
        "without error feedback; docs/codecs.md)",
    )
    p.add_argument(
        "--overlap",
        choices=["blocking", "async", "dear"],
        default="blocking",
        help="switch run: the DDP hook blocks (default), runs on a communication thread "
        "(async), or DeAR mode (dear: updates in the next forward, bucket size tuned)",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default="ncf",
        help="ncf: sparse embedding gradients (default); mlp: a small dense classifier; "
        "lm: a small transformer language model",
    )
    p.add_argument(
        "--bw",
        type=float,
        default=None,
        help="link bandwidth in Mbit/s, htb shaping (default: unshaped)",
    )
    p.add_argument(
        "--topo", type=Path, default=None, help="topology TOML file ([topology] hosts, bw_mbit)"
    )
    p.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    p.add_argument("--batch", type=int, default=64, help="positives per rank and step (default 64)")
    p.add_argument(
        "--users", type=int, default=20000, help="rows of the user embedding table (default 20000)"
    )
    p.add_argument(
        "--items", type=int, default=4000, help="rows of the item embedding table (default 4000)"
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="SGD learning rate (default: "
        + ", ".join(f"{m} {lr:g}" for m, lr in DEFAULT_LR.items())
        + ")",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        default=8,
        help="switch slots of the job's pool: packets in flight per rank (default 8)",
    )
    p.add_argument("--no-gloo", action="store_true", help="skip the gloo comparison run")
    p.add_argument(
        "--peers-first",
        action="store_true",
        help="run gloo and the peers before the switch run (default: after it)",
    )
    p.add_argument(
        "--peers",
        default="",
        help="comma-separated DDP-over-gloo variants to run after gloo, in the same network: "
        + ", ".join(PEERS)
        + " (run/peers.py)",
    )
    p.add_argument(
        "--timeout", type=float, default=900, help="seconds per training run (default 900)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="logs, results and the plot (default: the run's directory/out, printed at start)",
    )
    return p


def _controller_address(names: RunNames) -> str:
    """host:port of run `names`' controller."""
    return f"{names.controller_ip}:{CONTROLLER_PORT}"


def _controller_toml(
    switch_address: str,
    hosts: list[tuple[str, str, int]],
    out: Path,
    names: RunNames,
    creds: RunCredentials,
) -> str:
    from testnet.addresses import SWITCH_MAC
    from testnet.controller_process import config_toml

    return config_toml(
        {
            "controller": {
                "listen": _controller_address(names),
                "database": str(out / "controller.db"),
                "heartbeat_interval": 1.0,
                "lease": 10.0,
                "join_timeout": 120.0,
                **creds.controller_keys(),
            },
            "operator": creds.operators(),
            "switch": [
                {
                    "name": "s1",
                    "address": switch_address,
                    "mac": SWITCH_MAC,
                    "service_ip": names.service_ip,
                    "hosts": [
                        {"ip": ip, "mac": mac, "switch_port": port} for ip, mac, port in hosts
                    ],
                }
            ],
        }
    )


def _controller_process(
    net: Mininet, topo: Topology, out: Path, state: RunState, creds: RunCredentials
) -> ControllerProcess:
    """`aggctl serve` for the controller's host (root namespace), on TLS with the run's
    operator credential: its configuration written, not started yet."""
    from controller.credentials import operator_token
    from testnet.addresses import host_mac
    from testnet.controller_process import ControllerProcess

    names = state.names
    sw = net.switches[0]
    c = net.get(names.controller_host)
    hosts = [(names.host_ip(i), host_mac(i), host_switch_port(i)) for i in range(topo.hosts)]
    hosts.append((names.controller_ip, c.defaultIntf().MAC(), topo.hosts + 1))
    cfg = out / "controller.toml"
    cfg.write_text(_controller_toml(sw.process.address, hosts, out, names, creds))
    (out / "controller.db").unlink(missing_ok=True)
    return ControllerProcess(
        cfg,
        _controller_address(names),
        out / "controller.log",
        ca=creds.ca,
        token=operator_token(creds.operator_token_file),
    )


def _rank_command(
    mode: str,
    args: argparse.Namespace,
    names: RunNames,
    rank: int,
    world: int,
    port: int,
    iface: str,
) -> list[str]:
    """torchrun of run.train for host `rank` of `world` (rank 0's host is the master),
    counting the bytes sent on `iface`."""
    cmd = [PY, "-m", "torch.distributed.run", "--nnodes", str(world), "--nproc-per-node", "1"]
    cmd += ["--node-rank", str(rank), "--master-addr", names.host_ip(0)]
    cmd += ["--master-port", str(port), "-m", "run.train", "--mode", mode]
    cmd += ["--codec", args.codec, "--overlap", args.overlap, "--model", args.model]
    cmd += [arg for kv in args.codec_option for arg in ("--codec-option", kv)]
    cmd += ["--steps", str(args.steps), "--users", str(args.users), "--items", str(args.items)]
    cmd += ["--batch", str(args.batch), "--lr", str(args.lr), "--iface", iface]
    cmd += ["--out", str(args.out)]
    if mode == "switch":
        cmd += ["--controller", _controller_address(names)]
        cmd += ["--pool-size", str(args.pool_size)]
    return cmd


def _run_job(
    mode: str,
    net: Mininet,
    args: argparse.Namespace,
    state: RunState,
    port: int,
    creds: RunCredentials | None = None,
) -> None:
    """One torchrun per host (rank = host index), rank 0's output streamed here. With `creds`
    every rank verifies the controller against the run's CA and rank 0, which creates the job,
    reads the operator credential from its file (the environment names the files)."""
    hosts = [h for h in net.hosts if h.inNamespace]
    procs, logs = [], []
    for i, h in enumerate(hosts):
        iface = h.defaultIntf().name
        cmd = _rank_command(mode, args, state.names, i, len(hosts), port, iface)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GLOO_SOCKET_IFNAME": iface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(creds.client_env(operator=i == 0) if creds is not None else {}),
        }
        logs.append(args.out / f"{mode}-rank{i}.log")
        with open(logs[-1], "wb") as rank_log:  # the rank keeps its own descriptor
            procs.append(
                h.popen(cmd, env=env, stdout=rank_log, stderr=subprocess.STDOUT, cwd=str(ROOT))
            )
        state.add("pgids", procs[-1].pid)
    try:
        _follow(mode, procs, logs, args.timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def _follow(mode: str, procs: list[subprocess.Popen], logs: list[Path], timeout: float) -> None:
    """Stream rank 0's step lines until every rank ended (or one failed, or `timeout` s
    passed: TimeoutError); RuntimeError with the log tails of the ranks that failed."""
    deadline, shown = time.monotonic() + timeout, 0
    while True:
        text = logs[0].read_text(errors="replace")
        for line in text[shown:].splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            shown += len(line)
            if line.startswith(("[switch]", "[gloo")):
                print(line, end="", flush=True)
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {mode} run did not finish within {timeout:.0f} s")
        time.sleep(0.2)
    bad = [i for i, p in enumerate(procs) if p.wait(30) != 0]
    if bad:
        tails = "\n".join(
            f"--- rank {i} ({logs[i]}):\n" + logs[i].read_text(errors="replace")[-2500:]
            for i in bad
        )
        raise RuntimeError(f"the {mode} run failed on rank(s) {bad}:\n{tails}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class _Session:
    """What a run has started so far, for teardown (also after errors and Ctrl-C)."""

    state: RunState
    net: Mininet | None = None
    ctl: ControllerProcess | None = None
    creds: RunCredentials | None = None


def _settle(args: argparse.Namespace) -> tuple[str, Topology]:
    """Defaults that depend on other options: learning rate, switch target, topology."""
    from run.net import Topology

    if args.lr is None:
        args.lr = DEFAULT_LR[args.model]
    args.peer_list = [x for x in args.peers.split(",") if x]
    bad = [x for x in args.peer_list if x not in PEERS]
    if bad:
        raise ValueError(f"--peers {','.join(bad)}: expected some of {', '.join(PEERS)}")
    for kv in args.codec_option:
        if "=" not in kv or not kv.split("=", 1)[0]:
            raise ValueError(f"--codec-option {kv!r}: expected KEY=VALUE")
    if args.bmv2_opt is not None:
        os.environ[BMV2_OPT_ENV] = str(args.bmv2_opt)  # the switch process reads it
    target = args.target if args.target != "auto" else ("bmv2" if bmv2_available() else "refswitch")
    problem = target_problem(target)
    if problem:
        raise ValueError(f"--target {target}: {problem}")
    topo = (
        Topology.load(args.topo, hosts=args.hosts, bw_mbit=args.bw)
        if args.topo
        else Topology(hosts=args.hosts or 4, bw_mbit=args.bw or 0.0)
    )
    return target, topo


def _prepare_out(args: argparse.Namespace, names: RunNames) -> None:
    """The output directory (by default the run's own), emptied of an earlier run's files."""
    if args.out is None:
        args.out = names.directory / "out"
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*"):
        if old.is_file():
            old.unlink()


def _build(session: _Session, topo: Topology, target: str, out: Path) -> None:
    """Mininet with the switch, the hosts prepared, the controller up and synced."""
    from run.net import build, prepare_hosts

    names = session.state.names
    session.net = net = build(topo, target, out, names)
    for h in net.hosts:
        if h.inNamespace:
            session.state.add("netns", netns_id(h.pid))
        session.state.add("pgids", h.pid)
    net.start()
    session.state.add("pgids", net.switches[0].process.proc.pid)
    prepare_hosts(net, PY)
    session.creds = make_run_credentials(names.directory / "credentials", names.controller_ip)
    session.ctl = ctl = _controller_process(net, topo, out, session.state, session.creds)
    session.state.add("pgids", ctl.launch())
    ctl.wait_synced().close()
    print(
        f"controller on {_controller_address(names)} (host {names.controller_host}), switch "
        f"P4Runtime on {net.switches[0].process.address}; logs in {out}",
        flush=True,
    )


def _counters(names: RunNames, creds: RunCredentials) -> str:
    """`aggctl counters` as the operator sees it (over TLS, with the run's credential)."""
    address = _controller_address(names)
    done = subprocess.run(
        [PY, "-m", "controller", "--controller", address, *creds.aggctl_args(), "counters"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done.stdout + done.stderr


def _train(session: _Session, args: argparse.Namespace) -> str:
    """The switch run (then the switch's counters) and the gloo run and the peer runs, in
    that order or (--peers-first) the other way round; returns the counters."""
    assert session.net is not None and session.creds is not None
    others = ([] if args.no_gloo else ["gloo"]) + args.peer_list
    if args.peers_first:
        for i, mode in enumerate(others):
            _run_job(mode, session.net, args, session.state, 29501 + i)
    # rank 0 creates the job
    _run_job("switch", session.net, args, session.state, 29500, session.creds)
    counters = _counters(session.state.names, session.creds)
    if not args.peers_first:
        for i, mode in enumerate(others):
            _run_job(mode, session.net, args, session.state, 29501 + i)
    return counters


def _report(args: argparse.Namespace, topo: Topology, target: str, counters: str) -> int:
    """Summary table, counters, plot, and switch vs gloo parameters; 0 when they agree."""
    from run import report

    switch_run = f"switch ({args.codec}, {args.overlap}, {target})"
    runs = {switch_run: report.read_steps(args.out / "switch.jsonl")}
    if not args.no_gloo:
        runs["DDP over gloo"] = report.read_steps(args.out / "gloo.jsonl")
    for peer in args.peer_list:
        runs[peer] = report.read_steps(args.out / f"{peer}.jsonl")
    print(
        "\nsummary (wire = bytes each host sent per step, everything included; "
        "dense = the model's float32 gradients)"
    )
    print(report.summary_table(runs))
    overlap = report.overlap_summary(runs[switch_run], args.out)
    if overlap:
        print(overlap)
    print("\nswitch counters (aggctl counters)\n" + counters.strip())
    plot = args.out / "make-run.png"
    report.plot(runs, plot, f"{topo.hosts} hosts, {target}, {topo.describe_bw()}")
    ok = True
    if not args.no_gloo:
        diff = report.compare(args.out / "switch.pt", args.out / "gloo.pt")
        bound = report.fixed_point_bound(runs[next(iter(runs))], topo.hosts, args.lr)
        head = f"\nfinal parameters, switch vs gloo: max |difference| {diff:.3g}"
        if is_exact(args.codec):  # exact up to the fixed-point bound
            ok = diff <= bound
            verdict = "AGREE within the bound" if ok else "DIFFER beyond the bound"
            print(f"{head}, fixed-point bound {bound:.3g}: {verdict}")
        else:
            print(f"{head} ({args.codec} is lossy: no bound)")
    print(f"plot: {plot}")
    return 0 if ok else 1


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


def run(args: argparse.Namespace) -> int:
    """Build, train twice, report, and tear everything down (also on errors and Ctrl-C)."""
    target, topo = _settle(args)
    session = _Session(RunState.claim())
    names = session.state.names
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:  # the claimed run number is released in _teardown, whatever fails
        _prepare_out(args, names)
        print(
            f"make run: run {names.number} (stop it with `make stop RUN={names.number}`), "
            f"{topo.hosts} hosts, switch {target}, model {args.model}, codec {args.codec}"
            f"{''.join(f' {kv}' for kv in args.codec_option)}, "
            f"overlap {args.overlap}, links {topo.describe_bw()}, {args.steps} steps",
            flush=True,
        )
        _build(session, topo, target, args.out)
        counters = _train(session, args)
        return _report(args, topo, target, counters)
    finally:
        _teardown(session)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.codec == "auto" and args.codec_option:
        parser.error("--codec-option needs a fixed --codec (auto chooses codecs per bucket)")
    if args.codec == "auto" and args.overlap == "blocking":
        args.overlap = "async"  # auto measures the delay beside backward
    if os.geteuid() != 0:
        print("make run needs root (Mininet, network namespaces)", file=sys.stderr)
        return 2
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: everything was stopped and removed", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError, ValueError, OSError) as exc:
        print(f"make run failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

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
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from controller.config import DEFAULT_PORT
from run.model import DEFAULT_LR, MODELS
from run.state import STATE_DIR, RunState, netns_id, pids_in_netns
from testnet.switch_process import bmv2_available

if TYPE_CHECKING:
    from mininet.net import Mininet

    from run.net import Topology

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
        choices=["auto", "bmv2", "refswitch"],
        default="auto",
        help="switch (auto: BMv2 when simple_switch_grpc is installed)",
    )
    p.add_argument(
        "--codec",
        default="lossless",
        choices=["lossless", "fixed_point", "cltk", "ef_fixed_point", "lowbit16", "lowbit8"],
        help="homomorphic codec of the switch run (default lossless)",
    )
    p.add_argument(
        "--model",
        choices=MODELS,
        default="ncf",
        help="ncf: sparse embedding gradients (default); mlp: a small dense classifier",
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
        "--timeout", type=float, default=900, help="seconds per training run (default 900)"
    )
    p.add_argument("--out", type=Path, default=STATE_DIR / "out", help="logs, results and the plot")
    return p


def _controller_toml(switch_address: str, hosts: list[tuple[str, str, int]], out: Path) -> str:
    from run.net import CONTROLLER_IP
    from testnet.controller_process import config_toml
    from testnet.fabric import SERVICE_IP, SWITCH_MAC

    return config_toml(
        {
            "controller": {
                "listen": f"{CONTROLLER_IP}:{CONTROLLER_PORT}",
                "database": str(out / "controller.db"),
                "heartbeat_interval": 1.0,
                "lease": 10.0,
                "join_timeout": 120.0,
            },
            "switch": [
                {
                    "name": "s1",
                    "address": switch_address,
                    "mac": SWITCH_MAC,
                    "service_ip": SERVICE_IP,
                    "hosts": [
                        {"ip": ip, "mac": mac, "switch_port": port} for ip, mac, port in hosts
                    ],
                }
            ],
        }
    )


def _start_controller(net: Mininet, topo: Topology, out: Path, state: RunState) -> subprocess.Popen:
    """Start `aggctl serve` on the controller's host (root namespace) and wait until it has synced the switch."""
    from controller.client import ControllerClient
    from run.net import CONTROLLER_IP, host_mac

    sw = net.switches[0]
    c = net.get("hgc0")
    hosts = [(f"10.0.0.{i + 1}", host_mac(i), i + 1) for i in range(topo.hosts)]
    hosts.append((CONTROLLER_IP, c.defaultIntf().MAC(), topo.hosts + 1))
    cfg = out / "controller.toml"
    cfg.write_text(_controller_toml(sw.process.address, hosts, out))
    (out / "controller.db").unlink(missing_ok=True)
    log = open(out / "controller.log", "wb")
    proc = subprocess.Popen(
        [PY, "-m", "controller", "serve", "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    state.add("pgids", proc.pid)
    with ControllerClient(f"{CONTROLLER_IP}:{CONTROLLER_PORT}", timeout=2.0) as client:
        deadline = time.monotonic() + 30
        while True:
            try:
                if all(s.connected for s in client.status().switches):
                    return proc
            except Exception:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the controller did not come up:\n"
                    + (out / "controller.log").read_text()[-2000:]
                )
            time.sleep(0.3)


def _run_job(
    mode: str, net: Mininet, args: argparse.Namespace, job: Any | None, state: RunState, port: int
) -> None:
    """One torchrun per host (rank = host index), rank 0's output streamed here."""
    from run.net import CONTROLLER_IP

    hosts = [h for h in net.hosts if h.inNamespace]
    procs, logs = [], []
    for i, h in enumerate(hosts):
        iface = h.defaultIntf().name
        cmd = [
            PY,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(hosts)),
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(i),
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "run.train",
            "--mode",
            mode,
            "--codec",
            args.codec,
            "--model",
            args.model,
            "--steps",
            str(args.steps),
            "--users",
            str(args.users),
            "--items",
            str(args.items),
            "--batch",
            str(args.batch),
            "--lr",
            str(args.lr),
            "--ip",
            f"10.0.0.{i + 1}",
            "--iface",
            iface,
            "--switch-port",
            str(i + 1),
            "--out",
            str(args.out),
        ]
        if job is not None:
            cmd += [
                "--controller",
                f"{CONTROLLER_IP}:{CONTROLLER_PORT}",
                "--job-id",
                str(job.job_id),
                "--token",
                job.token,
            ]
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GLOO_SOCKET_IFNAME": iface,
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        logs.append(args.out / f"{mode}-rank{i}.log")
        procs.append(
            h.popen(
                cmd, env=env, stdout=open(logs[-1], "wb"), stderr=subprocess.STDOUT, cwd=str(ROOT)
            )
        )
        state.add("pgids", procs[-1].pid)
    deadline, shown = time.monotonic() + args.timeout, 0
    try:
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
                raise TimeoutError(f"the {mode} run did not finish within {args.timeout:.0f} s")
            time.sleep(0.2)
        bad = [i for i, p in enumerate(procs) if p.wait(30) != 0]
        if bad:
            tails = "\n".join(
                f"--- rank {i} ({logs[i]}):\n" + logs[i].read_text(errors="replace")[-2500:]
                for i in bad
            )
            raise RuntimeError(f"the {mode} run failed on rank(s) {bad}:\n{tails}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    """Build, train twice, report, and tear everything down (also on errors and Ctrl-C)."""
    from controller.client import ControllerClient
    from run import report
    from run.net import CONTROLLER_IP, Topology, build, prepare_hosts

    if args.lr is None:
        args.lr = DEFAULT_LR[args.model]
    target = args.target if args.target != "auto" else ("bmv2" if bmv2_available() else "refswitch")
    topo = (
        Topology.load(args.topo, hosts=args.hosts, bw_mbit=args.bw)
        if args.topo
        else Topology(hosts=args.hosts or 4, bw_mbit=args.bw or 0.0)
    )
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*"):
        if old.is_file():
            old.unlink()
    state = RunState()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    net, ctl = None, None
    bw = f"{topo.bw_mbit:g} Mbit/s (htb)" if topo.bw_mbit else "unshaped"
    print(
        f"make run: {topo.hosts} hosts, switch {target}, model {args.model}, codec {args.codec}, links {bw}, {args.steps} steps",
        flush=True,
    )
    try:
        net = build(topo, target, args.out)
        for h in net.hosts:
            if h.inNamespace:
                state.add("netns", netns_id(h.pid))
            state.add("pgids", h.pid)
        net.start()
        state.add("pgids", net.switches[0].process.proc.pid)
        prepare_hosts(net, PY)
        ctl = _start_controller(net, topo, args.out, state)
        print(
            f"controller on {CONTROLLER_IP}:{CONTROLLER_PORT} (host hgc0), switch P4Runtime on "
            f"{net.switches[0].process.address}; logs in {args.out}",
            flush=True,
        )
        with ControllerClient(f"{CONTROLLER_IP}:{CONTROLLER_PORT}", timeout=10.0) as client:
            job = client.create_job(
                "make-run", world_size=topo.hosts, codec=args.codec, pool_size=args.pool_size
            )
            _run_job("switch", net, args, job, state, 29500)
            done = subprocess.run(
                [
                    PY,
                    "-m",
                    "controller",
                    "--controller",
                    f"{CONTROLLER_IP}:{CONTROLLER_PORT}",
                    "counters",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            counters = done.stdout + done.stderr
        if not args.no_gloo:
            _run_job("gloo", net, args, None, state, 29501)
        runs = {f"switch ({args.codec}, {target})": report.read_steps(args.out / "switch.jsonl")}
        if not args.no_gloo:
            runs["DDP over gloo"] = report.read_steps(args.out / "gloo.jsonl")
        print(
            "\nsummary (wire = bytes each host sent per step, everything included; dense = the model's float32 gradients)"
        )
        print(report.summary_table(runs))
        print("\nswitch counters (aggctl counters)\n" + counters.strip())
        plot = args.out / "make-run.png"
        report.plot(runs, plot, f"{topo.hosts} hosts, {target}, {bw}")
        ok = True
        if not args.no_gloo:
            diff = report.compare(args.out / "switch.pt", args.out / "gloo.pt")
            bound = report.fixed_point_bound(runs[next(iter(runs))], topo.hosts, args.lr)
            if args.codec in ("lossless", "fixed_point"):
                ok = diff <= bound
                print(
                    f"\nfinal parameters, switch vs gloo: max |difference| {diff:.3g}, fixed-point bound "
                    f"{bound:.3g}: "
                    + ("AGREE within the bound" if ok else "DIFFER beyond the bound")
                )
            else:
                print(
                    f"\nfinal parameters, switch vs gloo: max |difference| {diff:.3g} ({args.codec} is lossy: no bound)"
                )
        print(f"plot: {plot}")
        return 0 if ok else 1
    finally:
        if ctl is not None and ctl.poll() is None:
            ctl.terminate()
            try:
                ctl.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(ctl.pid, signal.SIGKILL)
                ctl.wait(5)
        if net is not None:
            for h in net.hosts:  # stragglers would keep a host's namespace alive
                if h.inNamespace:
                    for pid in pids_in_netns(netns_id(h.pid)):
                        if pid != h.pid:
                            os.kill(pid, signal.SIGKILL)
            net.stop()
        state.clear()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    args = _parser().parse_args(argv)
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

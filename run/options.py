"""The command line of `make run` (`python -m run`): its options, grouped by what they set
(the network, the switch run, the training job, the comparison runs, the output), and the
rules between them: codec "auto" and the overlap modes, defaults that depend on other
options, the switch target that can start here."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from homagg.api.credentials import TENANT_MAX_SLOTS
from homagg.control.config import ControllerConfig
from homagg.environment import BMV2_OPT_ENV
from homagg.lab import REPO_ROOT
from homagg.lab.switch_process import AUTO_TARGET, TARGETS, resolve_target, target_problem
from homagg.worker.auto.control import auto_config
from homagg.worker.codecs import AUTO_CODEC, CODEC_CHOICES, DEFAULT_CODEC
from run.control import COUNTERS_TIMEOUT_S, run_pool_size
from run.model import DEFAULT_LR, MODELS
from run.names import DEFAULT_HOSTS
from run.peers import PEERS
from run.script import check_script

if TYPE_CHECKING:
    from run.net import Topology

# How the switch run's communication overlaps the computation: the DDP hook blocks, runs
# on a communication thread, or DeAR (updates in the next forward).
BLOCKING, ASYNC, DEAR = "blocking", "async", "dear"
OVERLAP_MODES = (BLOCKING, ASYNC, DEAR)


def parser(description: str = "", epilog: str = "") -> argparse.ArgumentParser:
    """The argument parser of `python -m run`; its help opens with `description` and ends
    with `epilog` (run/__main__.py's docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m run",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _network_options(p.add_argument_group("network"))
    _switch_options(p.add_argument_group("switch run"))
    _training_options(p.add_argument_group("training (every run)"))
    _comparison_options(p.add_argument_group("comparison runs"))
    _script_options(p.add_argument_group("your own script (run/script.py)"))
    output = p.add_argument_group("output")
    output.add_argument(
        "--out",
        type=Path,
        default=None,
        help="logs, results and the plot (default: the run's directory/out, printed at start); "
        "a new or empty directory, or an earlier run's --out, whose files the run replaces",
    )
    output.add_argument(
        "--counters-timeout",
        type=float,
        default=COUNTERS_TIMEOUT_S,
        metavar="S",
        help=f"seconds for `aggctl counters` after the switch run (default {COUNTERS_TIMEOUT_S:g}; "
        "one second try waits twice that, then the report says they were not read)",
    )
    output.add_argument(
        "--no-plot",
        action="store_true",
        help="skip make-run.png (matplotlib costs a few seconds of CPU a run: for scripted "
        "runs that read the summary and the JSON lines only)",
    )
    return p


def _network_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--hosts",
        type=int,
        default=None,
        help=f"worker hosts, one rank each (default {DEFAULT_HOSTS})",
    )
    g.add_argument(
        "--target",
        choices=[AUTO_TARGET, *TARGETS],
        default=AUTO_TARGET,
        help="switch (auto: BMv2 when simple_switch_grpc is installed; bmv2-opt: the "
        "optimized BMv2 build under --bmv2-opt, docs/bmv2.md)",
    )
    g.add_argument(
        "--bmv2-opt",
        type=Path,
        default=None,
        metavar="PREFIX",
        help=f"install prefix of the optimized BMv2 build (--target bmv2-opt; default: "
        f"${BMV2_OPT_ENV})",
    )
    g.add_argument(
        "--bw",
        type=float,
        default=None,
        help="link bandwidth in Mbit/s, htb shaping (default: unshaped)",
    )
    g.add_argument(
        "--topo",
        type=Path,
        default=None,
        help="topology TOML file ([topology] hosts, bw_mbit, leaves), or the name of one in "
        "mininet/: star4, two-level (2 leaves x 4 hosts under a spine)",
    )


def _switch_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--codec",
        default=DEFAULT_CODEC,
        choices=CODEC_CHOICES,
        help=f"homomorphic codec of the switch run (default {DEFAULT_CODEC}); {AUTO_CODEC}: "
        "the path and codec chosen per bucket and step from measured costs (asynchronous hook "
        "or DeAR)",
    )
    g.add_argument(
        "--codec-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the switch run's codec, repeatable (e.g. gamma=0: lowbit8 "
        "without error feedback; docs/codecs.md); with --codec auto, the controller's "
        "settings (e.g. lag=0, min_density=0.25; docs/worker.md)",
    )
    g.add_argument(
        "--overlap",
        choices=OVERLAP_MODES,
        default=BLOCKING,
        help="switch run: the DDP hook blocks (default), runs on a communication thread "
        "(async), or DeAR mode (dear: updates in the next forward, bucket size tuned)",
    )
    g.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="switch slots of the job's pool: packets in flight per rank, for make run's "
        "model and a --script's job alike (the run's controller default; default "
        f"{ControllerConfig.default_pool_size}, the controller's own; less on a tree of many "
        "leaves, where the job holds its pool on every switch and the tenant's quota must "
        "hold two such jobs)",
    )


def _training_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--model",
        choices=MODELS,
        default="ncf",
        help="ncf: sparse embedding gradients (default); ncf-dense: the same NCF with "
        "dense tables (nn.Embedding's default: DDP over gloo all-reduces whole tables); "
        "mlp: a small dense classifier; "
        "lm: a small transformer language model",
    )
    g.add_argument("--steps", type=int, default=120, help="training steps per run (default 120)")
    g.add_argument("--batch", type=int, default=64, help="positives per rank and step (default 64)")
    g.add_argument(
        "--users", type=int, default=20000, help="rows of the user embedding table (default 20000)"
    )
    g.add_argument(
        "--items", type=int, default=4000, help="rows of the item embedding table (default 4000)"
    )
    g.add_argument(
        "--lr",
        type=float,
        default=None,
        help="SGD learning rate (default: "
        + ", ".join(f"{m} {lr:g}" for m, lr in DEFAULT_LR.items())
        + ")",
    )
    g.add_argument(
        "--timeout", type=float, default=900, help="seconds per training run (default 900)"
    )


def _comparison_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--no-gloo", action="store_true", help="skip the gloo comparison run")
    g.add_argument(
        "--peers-first",
        action="store_true",
        help="run gloo and the peers before the switch run (default: after it)",
    )
    g.add_argument(
        "--peers",
        default="",
        help="comma-separated DDP-over-gloo variants to run after gloo, in the same network: "
        + ", ".join(PEERS)
        + " (run/peers.py)",
    )


def _script_options(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--script",
        type=Path,
        default=None,
        metavar="PATH",
        help="run this torchrun script (yours, with homagg's two lines) instead of make run's "
        "model: through the switch, then over gloo with HOMAGG_ATTACH=0; the summary shows "
        "wall time, bytes each host sent and the switch counters (its step times are its own "
        "output); make run's model options are refused with it",
    )
    g.add_argument(
        "--script-args",
        default="",
        metavar="ARGS",
        help="the script's own arguments, one string split as a shell would (write "
        '--script-args="--verbose" when it starts with a dash and has no space); each run '
        "works in <out>/switch or <out>/gloo",
    )


def codec_options(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE strings as codec options: numbers as int or float, true/false as bool,
    anything else as a string (gamma=0 -> {"gamma": 0})."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--codec-option {pair!r}: expected KEY=VALUE")
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def check_codec_rules(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Codec "auto" chooses per bucket beside backward (asynchronous hook or DeAR); its
    codec options are the controller's settings (lag=0, min_density=0.25, ...); it makes
    the default blocking hook asynchronous. A conflict exits through `p`."""
    if args.codec != AUTO_CODEC:
        return
    try:
        auto_config(codec_options(args.codec_option), lanes=False)
    except (TypeError, ValueError) as exc:
        p.error(f"--codec-option with --codec auto: {exc}")
    if args.overlap == BLOCKING:
        args.overlap = ASYNC  # auto measures the delay beside backward


TARGET_NAMES = {
    "bmv2": "BMv2's simple_switch_grpc",
    "bmv2-opt": "BMv2's simple_switch_grpc, optimized build",
    "ebpf": "the P4 program as an eBPF program in the kernel",
    "refswitch": "the reference switch, embedded in Python",
}


def describe_target(requested: str, target: str) -> str:
    """The switch a run uses, for its first line ("switch target T (what T is)"), and when
    `--target auto` did not find BMv2, that its times are not comparable with the README's
    BMv2 sample."""
    what = TARGET_NAMES.get(target, target)
    if requested == AUTO_TARGET and target not in ("bmv2", "bmv2-opt"):
        what += (
            "; chosen by --target auto: simple_switch_grpc is not installed, so times differ "
            "from the README's BMv2 sample"
        )
    return f"switch target {target} ({what})"


def topology_file(topo: Path) -> Path:
    """A --topo value: a TOML file, or the name of one in mininet/ (two-level, star4)."""
    named = REPO_ROOT / "mininet" / f"{topo}.toml"
    if topo.exists() or topo.parent != Path(".") or not named.exists():
        return topo
    return named


def settle(args: argparse.Namespace) -> tuple[str, Topology]:
    """Defaults that depend on other options (learning rate, switch target, topology) and
    the checks argparse cannot make; ValueError names the option at fault."""
    from run.net import Topology

    check_script(args)  # before the defaults below: an option of make run's model is refused
    if args.lr is None:
        args.lr = DEFAULT_LR[args.model]
    args.peer_list = [x for x in args.peers.split(",") if x]
    bad = [x for x in args.peer_list if x not in PEERS]
    if bad:
        raise ValueError(f"--peers {','.join(bad)}: expected some of {', '.join(PEERS)}")
    codec_options(args.codec_option)  # a malformed KEY=VALUE fails here, before Mininet
    if not args.counters_timeout > 0:
        raise ValueError(f"--counters-timeout {args.counters_timeout:g}: expected seconds > 0")
    if args.bmv2_opt is not None:
        os.environ[BMV2_OPT_ENV] = str(args.bmv2_opt)  # the switch process reads it
    target = resolve_target(args.target)
    problem = target_problem(target)
    if problem:
        raise ValueError(f"--target {target}: {problem}")
    topo = (
        Topology.load(topology_file(args.topo), hosts=args.hosts, bw_mbit=args.bw)
        if args.topo
        else Topology(hosts=args.hosts or DEFAULT_HOSTS, bw_mbit=args.bw or 0.0)
    )
    room = TENANT_MAX_SLOTS // topo.switches  # one job, its pool on every switch
    if args.pool_size is None:
        args.pool_size = run_pool_size(topo.switches)
    elif not 1 <= args.pool_size <= room:
        raise ValueError(
            f"--pool-size {args.pool_size}: expected 1 to {room} slots (the run's tenant holds "
            f"{TENANT_MAX_SLOTS}, and a job holds its pool on each of its {topo.switches} "
            "switch(es))"
        )
    return target, topo

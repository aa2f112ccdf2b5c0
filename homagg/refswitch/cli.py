"""Command line of the reference switch, compatible with simple_switch_grpc's options:

refswitch -i 1@veth1 -i 2@veth2 --device-id 0 --no-p4 -- --grpc-server-addr 127.0.0.1:9559
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable
from typing import Protocol

from homagg.metrics_endpoint import DEFAULT_METRICS_HOST, MetricsEndpoint
from homagg.refswitch.metrics import SwitchCollector, serve_switch_metrics
from homagg.refswitch.ports import parse_port_spec
from homagg.refswitch.switch import ReferenceSwitch


class Switch(Protocol):
    """What main() runs: the reference switch or the eBPF switch."""

    def start(self) -> int: ...
    def stop(self) -> None: ...
    def run(self) -> None: ...
    def close(self) -> None: ...
    def collector(self) -> SwitchCollector: ...


SwitchFactory = Callable[[dict[int, str], str, int, float], Switch]


def build_parser(prog: str = "refswitch") -> argparse.ArgumentParser:
    """The argument parser (BMv2's flag names where they exist)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Embedded reference switch: the homagg P4 program in Python, answering "
        "P4Runtime like simple_switch_grpc. The pipeline (P4Info + BMv2 JSON) is "
        "pushed by the controller over P4Runtime.",
        epilog="example: refswitch -i 1@veth1 -i 2@veth2 --grpc-server-addr 127.0.0.1:9559",
    )
    p.add_argument(
        "-i",
        "--interface",
        action="append",
        default=[],
        metavar="PORT@IFACE",
        help="attach switch port PORT to network interface IFACE (repeatable)",
    )
    p.add_argument("--device-id", type=int, default=0, help="P4Runtime device id (default 0)")
    p.add_argument(
        "--grpc-server-addr",
        default="127.0.0.1:9559",
        help="address of the P4Runtime server (default 127.0.0.1:9559, loopback: only the "
        "controller may reach it, docs/controller.md)",
    )
    p.add_argument(
        "--no-p4",
        action="store_true",
        help="accepted for simple_switch_grpc compatibility; the switch always "
        "starts without a program",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning"],
        help="debug logs every dropped packet with its reason",
    )
    p.add_argument(
        "--stats-interval",
        type=float,
        default=10.0,
        help="seconds between drop summaries in the log (default 10)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics (per-port packets, drops by reason, socket overflows) "
        "on PORT; off unless given",
    )
    p.add_argument(
        "--metrics-addr",
        default=DEFAULT_METRICS_HOST,
        metavar="HOST",
        help=f"address of the metrics endpoint (default {DEFAULT_METRICS_HOST}, loopback: "
        "another exposes every port's counters to whoever reaches it)",
    )
    return p


def is_wildcard(address: str) -> bool:
    """Whether a host:port listens on every interface (0.0.0.0, [::], or no host)."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("", "0.0.0.0", "::")


def main(argv: list[str] | None = None) -> int:
    """Run the reference switch until SIGTERM or SIGINT."""
    return serve(argv, ReferenceSwitch, "refswitch")


def serve(argv: list[str] | None, make_switch: SwitchFactory, prog: str) -> int:
    """Parse the command line, make the switch and run it until SIGTERM or SIGINT."""
    args = build_parser(prog).parse_args(
        [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--"]
    )
    logging.basicConfig(
        level=args.log_level.upper(), format=f"%(asctime)s {prog} %(levelname)s %(message)s"
    )
    log = logging.getLogger(prog)
    try:
        ports = dict(parse_port_spec(spec) for spec in args.interface)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    try:
        switch = make_switch(ports, args.grpc_server_addr, args.device_id, args.stats_interval)
    except (OSError, RuntimeError) as exc:
        log.error("cannot open the switch ports: %s", exc)
        return 1
    try:
        port = switch.start()
    except (OSError, RuntimeError) as exc:
        log.error("cannot start the P4Runtime server on %s: %s", args.grpc_server_addr, exc)
        switch.close()
        return 1
    if is_wildcard(args.grpc_server_addr):
        log.warning(
            "P4Runtime on %s answers every network: whoever reaches it can become primary and "
            "rewrite the tables; bind the controller's side only (docs/controller.md, Security)",
            args.grpc_server_addr,
        )
    metrics: MetricsEndpoint | None = None
    if args.metrics_port is not None:
        try:
            metrics = serve_switch_metrics(switch.collector(), args.metrics_addr, args.metrics_port)
        except (OSError, ValueError) as exc:
            log.error(
                "cannot serve metrics on %s:%s: %s", args.metrics_addr, args.metrics_port, exc
            )
            switch.close()
            return 1
        log.info("metrics on %s", metrics.url)
    signal.signal(signal.SIGTERM, lambda *_: switch.stop())
    signal.signal(signal.SIGINT, lambda *_: switch.stop())
    log.info(
        "P4Runtime on port %d, device %d, ports %s",
        port,
        args.device_id,
        ", ".join(f"{p}@{i}" for p, i in sorted(ports.items())) or "none",
    )
    try:
        switch.run()
    finally:
        if metrics is not None:
            metrics.close()
        switch.close()
        log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`aggctl serve`: its options, the checks of a configuration before it serves (TLS and
operators, loopback for an insecure or a metrics address), and the controller process's run
until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

from homagg.control.config import (
    ConfigError,
    ControllerConfig,
    check_address,
    check_metrics_exposure,
    is_loopback,
    load_config,
)


def serve_options(serve: argparse.ArgumentParser) -> None:
    """`aggctl serve`: the configuration and what overrides it."""
    serve.add_argument(
        "--config", required=True, type=Path, metavar="FILE", help="the TOML configuration"
    )
    serve.add_argument("--listen", metavar="ADDR", help="override controller.listen")
    serve.add_argument("--database", type=Path, metavar="PATH", help="override controller.database")
    serve.add_argument(
        "--tls-cert", type=Path, metavar="FILE", help="override controller.tls_cert (PEM)"
    )
    serve.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="override controller.tls_key (PEM)"
    )
    serve.add_argument(
        "--fresh-database",
        action="store_true",
        help="start with no jobs: an existing database (e.g. one refused as empty or damaged) "
        "is kept aside as PATH.damaged-TIME, the switches' job entries are removed and new "
        "job ids start above every id they hold",
    )
    serve.add_argument(
        "--remove-unknown-jobs",
        action="store_true",
        help="remove from the switches the jobs this database has no record of (e.g. an "
        "older copy restored on purpose); without it (or --fresh-database) such jobs stop "
        "the controller with status 2 and stay on the switch",
    )
    serve.add_argument(
        "--insecure-non-loopback",
        action="store_true",
        help="with --insecure: also listen insecurely on an address other hosts can reach "
        "(a network only trusted hosts reach; logged as a warning)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT (controller.metrics_listen; 0: any "
        "free port, logged)",
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics there instead (another host than loopback needs "
        "--metrics-non-loopback)",
    )
    serve.add_argument(
        "--metrics-non-loopback",
        action="store_true",
        help="allow metrics on an address other hosts reach (controller.metrics_non_loopback): "
        "they show every job's numbers by job id, never names or tokens",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def check_secured(config: ControllerConfig, insecure: bool, non_loopback: bool = False) -> None:
    """Refuse a controller without TLS or without an operator credential, unless insecure;
    and an insecure one on an address other hosts can reach, unless non_loopback too."""
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    missing = []
    if config.tls_cert is None:
        missing.append("no TLS certificate (controller.tls_cert and tls_key, or --tls-cert)")
    if not config.operators:
        missing.append("no [[operator]] credential")
    if missing and not insecure:
        raise ConfigError(
            f"refusing to serve insecurely: {'; '.join(missing)}. Configure them "
            "(docs/controller.md, Security), or give --insecure for tests and local use"
        )
    if missing and not non_loopback and not is_loopback(config.listen):
        raise ConfigError(
            f"refusing to serve insecurely on {config.listen}, which is not a loopback "
            f"address ({'; '.join(missing)}): anyone who reaches it could release any job "
            "and read the job tokens. Listen on 127.0.0.1, [::1] or unix:PATH, configure TLS "
            "and an operator (docs/controller.md, Security), or, on a network only trusted "
            "hosts reach, add --insecure-non-loopback"
        )


def metrics_overrides(config: ControllerConfig, args: argparse.Namespace) -> ControllerConfig:
    """--metrics-port, --metrics-listen and --metrics-non-loopback over the configuration."""
    if args.metrics_port is not None and args.metrics_listen:
        raise ConfigError("--metrics-port and --metrics-listen: give one of them")
    listen = args.metrics_listen or (
        f"127.0.0.1:{args.metrics_port}" if args.metrics_port is not None else ""
    )
    if listen:
        config = replace(config, metrics_listen=check_address(listen, "--metrics", any_port=True))
    if args.metrics_non_loopback:
        config = replace(config, metrics_non_loopback=True)
    check_metrics_exposure(config, "aggctl serve")
    return config


def serve(args: argparse.Namespace) -> int:
    from homagg.api.tls import TlsError
    from homagg.control.service import ControllerServer
    from homagg.control.store import StoreError

    try:
        config = load_config(args.config)
        if args.listen:
            config = replace(config, listen=check_address(args.listen, "--listen", any_port=True))
        if args.database:
            config = replace(config, database=args.database)
        if args.tls_cert or args.tls_key:
            config = replace(config, tls_cert=args.tls_cert, tls_key=args.tls_key)
        config = metrics_overrides(config, args)
        check_secured(config, args.insecure, args.insecure_non_loopback)
    except ConfigError as exc:
        print(f"aggctl: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s aggctl %(levelname)s %(message)s"
    )
    log = logging.getLogger("aggctl")
    try:
        server = ControllerServer(
            config,
            fresh_database=args.fresh_database,
            remove_unknown_jobs=args.remove_unknown_jobs,
        )
    except StoreError as exc:
        print(f"aggctl: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        server.start()
    except (OSError, TlsError, StoreError) as exc:
        print(f"aggctl: {exc}", file=sys.stderr)
        server.stop()
        return 2 if isinstance(exc, StoreError) else 1
    try:
        while not stop.wait(0.2) and not server.refusal:
            pass
    finally:
        log.info("stopping (jobs stay installed and are restored on the next start)")
        server.stop()
    if server.refusal:
        print(f"aggctl: {server.refusal}", file=sys.stderr)
        return 2
    return 0

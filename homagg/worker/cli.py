"""`python -m homagg.worker`: create a job, join one rank and print its assignment, or benchmark
synthetic aggregation rounds through the switch with a codec (no torch training).

Secrets never go on the command line: the job token comes from --token-file,
$HOMAGG_TOKEN_FILE or $HOMAGG_TOKEN, the operator credential (create) from
--credential-file, $HOMAGG_OPERATOR_TOKEN_FILE or $HOMAGG_OPERATOR_TOKEN. The controller's
TLS certificate is verified against --ca-file or $HOMAGG_CA_FILE; --insecure (or
$HOMAGG_INSECURE=1) is plaintext (tests and local use), and one of the two is required."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from homagg.api.client import DEFAULT_LISTEN, ControllerClient
from homagg.api.credentials import SecretError, ca_file, job_token, operator_token
from homagg.api.tls import TlsError, plaintext_chosen
from homagg.environment import (
    CA_FILE_ENV,
    INSECURE_ENV,
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)
from homagg.wire.constants import WORKER_UDP_BASE
from homagg.worker.codecs import CODECS, DEFAULT_CODEC, make_codec
from homagg.worker.job.agent import AgentConfig, AgentError, WorkerAgent

EXAMPLES = {
    "create": (
        "HOMAGG_OPERATOR_TOKEN_FILE=op.token python -m homagg.worker create --controller "
        "127.0.0.1:50051 --ca-file ca.crt --name demo --world-size 2 --codec lossless "
        "--token-file job.token"
    ),
    "join": (
        "python -m homagg.worker join --controller 127.0.0.1:50051 --ca-file ca.crt --job-id 1 "
        f"--token-file job.token --rank 0 --ip 10.0.0.1 --udp-port {WORKER_UDP_BASE} "
        "--switch-port 1 --iface eth0 --json"
    ),
    "bench": (
        "python -m homagg.worker bench --controller 127.0.0.1:50051 --ca-file ca.crt --job-id 1 "
        f"--token-file job.token --rank 0 --ip 10.0.0.1 --udp-port {WORKER_UDP_BASE} "
        "--switch-port 1 --mac 02:00:00:00:01:01 "
        "--codec lossless --size 1000000 --density 0.01 --rounds 10   # run once per rank"
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m homagg.worker",
        allow_abbrev=False,  # `--token SECRET` must not pass as --token-file
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  " + "\n  ".join(EXAMPLES.values()),
    )
    sub = p.add_subparsers(dest="command", required=True)
    _create_options(_command(sub, "create", "create a job; prints its id and token"))
    join = _command(sub, "join", "join a job, wait until ready, print the assignment")
    _rank_options(join)
    join.add_argument(
        "--hold",
        type=float,
        default=0.0,
        help="stay joined (heartbeating) this many seconds",
    )
    bench = _command(sub, "bench", "synthetic aggregation rounds through the switch")
    _rank_options(bench)
    bench.add_argument("--codec", choices=CODECS, default=DEFAULT_CODEC)
    bench.add_argument("--size", type=int, default=100_000, help="float32 elements per round")
    bench.add_argument("--density", type=float, default=0.01, help="nonzero fraction (1: dense)")
    bench.add_argument("--rounds", type=int, default=10)
    bench.add_argument("--seed", type=int, default=0)
    return p


def _command(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """Subcommand `name` with its example and the controller's connection options."""
    c = sub.add_parser(
        name,
        help=help_text,
        epilog="example:\n  " + EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _connection(c)
    return c


def _create_options(c: argparse.ArgumentParser) -> None:
    """`create`: the operator's credential and the new job."""
    c.add_argument(
        "--credential-file",
        type=Path,
        metavar="FILE",
        help=f"the operator credential (default ${OPERATOR_TOKEN_FILE_ENV}, "
        f"else ${OPERATOR_TOKEN_ENV})",
    )
    c.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="write the new job's token here (mode 0600) and leave it out of the output",
    )
    c.add_argument("--name", default="job")
    c.add_argument("--world-size", type=int, required=True)
    c.add_argument("--codec", default=DEFAULT_CODEC)
    c.add_argument(
        "--pool-size",
        type=int,
        default=0,
        help="slots of the job's pool (0: the controller's default)",
    )
    c.add_argument("--json", action="store_true")


def _rank_options(s: argparse.ArgumentParser) -> None:
    """`join` and `bench`: the job, its token, and this rank's addresses."""
    s.add_argument("--job-id", type=int, required=True)
    s.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"the job token (default ${JOB_TOKEN_FILE_ENV}, else ${JOB_TOKEN_ENV})",
    )
    s.add_argument("--rank", type=int, required=True)
    s.add_argument(
        "--ip", required=True, help="this worker's IPv4 address (the UDP socket binds to it)"
    )
    s.add_argument("--udp-port", type=int, default=WORKER_UDP_BASE)
    s.add_argument(
        "--switch-port",
        type=int,
        required=True,
        help="the switch port this host is attached to",
    )
    s.add_argument("--mac", default="", help="this worker's MAC (default: read from --iface)")
    s.add_argument("--iface", default="")
    s.add_argument(
        "--netns", default="", help="open the UDP socket inside this network namespace (root)"
    )
    s.add_argument("--ready-timeout", type=float, default=30.0)
    s.add_argument("--json", action="store_true")


def _connection(p: argparse.ArgumentParser) -> None:
    """The options that say where the controller is and how to verify it."""
    p.add_argument("--controller", default=DEFAULT_LISTEN, help="default %(default)s")
    p.add_argument(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help=f"the CA that signed the controller's certificate (default ${CA_FILE_ENV})",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext to the controller (tests and local use only)",
    )


class UsageError(Exception):
    """Options that cannot work; the message says what to give instead."""


def _ca(a: argparse.Namespace) -> Path | None:
    """The CA to verify the controller with; None only when plaintext is chosen (--insecure
    or $HOMAGG_INSECURE=1)."""
    try:
        plaintext = a.insecure or plaintext_chosen()
    except TlsError as exc:
        raise UsageError(str(exc)) from None
    ca = None if a.insecure else ca_file(a.ca_file)
    if ca is None and not plaintext:
        raise UsageError(
            f"no CA to verify the controller with: give --ca-file FILE (or set ${CA_FILE_ENV}), "
            f"or --insecure (or ${INSECURE_ENV}=1) for a plaintext controller"
        )
    return ca


def _job_token(a: argparse.Namespace) -> str:
    token = job_token(a.token_file)
    if token is None:
        raise UsageError(
            f"no job token: give --token-file FILE, or set ${JOB_TOKEN_FILE_ENV} or "
            f"${JOB_TOKEN_ENV}"
        )
    return token


def _write_secret(path: Path, text: str) -> None:
    """Write a secret to a new file only its owner can read."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _socket_factory(netns: str) -> Callable[[], socket.socket] | None:
    if not netns:
        return None
    from homagg.lab.namespace import in_namespace  # only for namespaced test setups

    def make() -> socket.socket:
        with in_namespace(netns):
            return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    return make


def _agent(a: argparse.Namespace) -> WorkerAgent:
    ca = _ca(a)
    cfg = AgentConfig(
        controller=a.controller,
        job_id=a.job_id,
        token=_job_token(a),
        rank=a.rank,
        ip=a.ip,
        udp_port=a.udp_port,
        switch_port=a.switch_port,
        mac=a.mac,
        iface=a.iface,
        ready_timeout=a.ready_timeout,
        ca_file=ca,
        insecure=ca is None,
    )
    return WorkerAgent(cfg, _socket_factory(a.netns))


def cmd_create(a: argparse.Namespace) -> int:
    """Create a job and print job_id, token (unless --token-file) and pool."""
    ca = _ca(a)
    token = operator_token(a.credential_file)
    with ControllerClient(a.controller, 10.0, ca, token, insecure=ca is None) as c:
        job = c.create_job(a.name, world_size=a.world_size, codec=a.codec, pool_size=a.pool_size)
    out = {"job_id": job.job_id, "token": job.token, "switch": job.switch}
    out["pool_size"] = job.pool_size
    if a.token_file is not None:
        _write_secret(a.token_file, out.pop("token"))
    print(json.dumps(out) if a.json else "  ".join(f"{k}={v}" for k, v in out.items()))
    return 0


def cmd_join(a: argparse.Namespace) -> int:
    """Join, wait until ready, print the assignment (and hold the lease if asked)."""
    with _agent(a) as agent:
        asg = dataclasses.asdict(agent.joined()[0])
        if a.json:
            print(json.dumps(asg))
        else:
            for k, v in asg.items():
                print(f"{k:22} {v}")
        sys.stdout.flush()
        time.sleep(max(0.0, a.hold))
    return 0


def synthetic(size: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """A float32 vector with round(density * size) normal nonzeros at random positions."""
    x = np.zeros(size, np.float32)
    nnz = min(size, max(0, round(density * size)))
    idx = rng.choice(size, nnz, replace=False)
    x[idx] = rng.normal(size=nnz).astype(np.float32)
    return x


def cmd_bench(a: argparse.Namespace) -> int:
    """N rounds of a synthetic tensor through the switch; per-round and summary metrics."""
    rng = np.random.default_rng(a.seed * 1000 + a.rank)
    with _agent(a) as agent:
        asg, transport = agent.joined()
        codec = make_codec(a.codec, asg.world_size, asg.rank)
        rows = []
        for i in range(a.rounds):
            x = synthetic(a.size, a.density, rng)
            sent0, retx0 = transport.stats.packets_sent, transport.stats.retransmissions
            start = time.perf_counter()
            transport.run(codec.aggregate(x))
            secs = time.perf_counter() - start
            wire = (transport.stats.packets_sent - sent0) * transport.config.frame_bytes
            rows.append(
                {
                    "round": i,
                    "ms": secs * 1e3,
                    "dense_gbps": x.nbytes * 8 / secs / 1e9,
                    "wire_bytes": wire,
                    "wire_vs_dense": wire / x.nbytes,
                    "retransmissions": transport.stats.retransmissions - retx0,
                }
            )
            if not a.json:
                r = rows[-1]
                print(
                    f"round {i:3d}  {r['ms']:9.2f} ms  {r['dense_gbps']:7.3f} Gbit/s "
                    f"dense-equivalent  wire {wire:>10} B ({r['wire_vs_dense']:.3f} x dense)  "
                    f"retx {r['retransmissions']}"
                )
    summary = {
        "codec": a.codec,
        "size": a.size,
        "density": a.density,
        "world_size": asg.world_size,
        "median_ms": float(np.median([r["ms"] for r in rows])) if rows else 0.0,
        "wire_vs_dense": float(np.mean([r["wire_vs_dense"] for r in rows])) if rows else 0.0,
        "retransmissions": sum(r["retransmissions"] for r in rows),
        **transport.stats.latency_percentiles(),
    }
    if a.json:
        print(json.dumps({"rounds": rows, "summary": summary}))
    else:
        print(
            "summary  "
            + "  ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in summary.items()
            )
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (1: the controller refused or is unreachable)."""
    a = _parser().parse_args(argv)
    try:
        return {"create": cmd_create, "join": cmd_join, "bench": cmd_bench}[a.command](a)
    except (AgentError, UsageError, SecretError, TlsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (UsageError, SecretError, TlsError)) else 1
    except grpc.RpcError as exc:
        print(
            f"error: controller {a.controller}: {exc.code().name}: {exc.details()}", file=sys.stderr
        )
        return 1

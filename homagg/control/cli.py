"""aggctl: run the controller (`serve`) and inspect or operate a running one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from homagg.api.credentials import SecretError, ca_file, operator_token
from homagg.control.config import DEFAULT_LISTEN
from homagg.control.serve_command import serve, serve_options
from homagg.control.text_table import (
    job_switches,
    render_counters,
    render_jobs,
    render_pools,
    render_status,
)
from homagg.control.top import DETAILS as TOP_DETAILS
from homagg.control.top import SUMMARY as TOP_SUMMARY
from homagg.control.top import add_top_options, run_top
from homagg.environment import (
    CA_FILE_ENV,
    INSECURE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)

DESCRIPTION = f"""\
Control plane of homagg: in-network gradient aggregation on P4 switches.
`aggctl serve` runs the controller (P4Runtime to the switches, the job service for
workers); the other commands ask a running controller (--controller, default
{DEFAULT_LISTEN}) and print tables, or JSON with --json.

The controller speaks TLS: the other commands verify its certificate against --ca-file
(or ${CA_FILE_ENV}) and present the operator credential read from --credential-file,
${OPERATOR_TOKEN_FILE_ENV} or ${OPERATOR_TOKEN_ENV} (never a command-line argument).
--insecure (or ${INSECURE_ENV}=1) is plaintext, for tests and local use, and warns
(docs/controller.md, Security)."""

# gRPC's own status text when the server's maximum_concurrent_rpcs is reached (it cannot be
# set); what it means for the controller is added here.
CONCURRENCY_LIMIT_TEXT = "Concurrent RPC limit exceeded"
CONCURRENCY_LIMIT_HINT = (
    " (the controller already has 4 x controller.rpc_threads calls in progress or queued: "
    "retry in a moment; if it lasts, some client floods it, or raise rpc_threads)"
)

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "run the controller until SIGTERM/SIGINT",
        "Connects to every switch of the config (pushing the pipeline where it is missing,\n"
        "re-installing what a switch lost), restores the jobs of its database and serves the\n"
        "job API. It refuses to start without TLS (controller.tls_cert/tls_key) and an\n"
        "[[operator]] credential unless --insecure is given. Example:\n"
        "  aggctl serve --config controller.toml",
    ),
    "status": (
        "the controller and each switch: connected, slots used, jobs",
        "Example:\n  aggctl status\n  aggctl --controller 10.0.0.5:50051 status --json",
    ),
    "jobs": (
        "running jobs (--all: and recently ended ones)",
        "Example:\n  aggctl jobs --ranks\n  aggctl jobs --all --json",
    ),
    "job": (
        "operate one job: create, show, list, release",
        "create prints the job's id and its token (the workers' secret) once, or writes the\n"
        "token to --token-file (mode 0600) and leaves it out. Example:\n"
        "  aggctl job create demo --world-size 4 --codec lossless --pool-size 16 \\\n"
        "    --token-file job.token\n  aggctl job show 3 --json\n  aggctl job list --all\n"
        "  aggctl job release 3",
    ),
    "pools": (
        "each switch's slots: every job's pool and the free ranges, then each port's buffer "
        "(slots in flight of the jobs with a rank there, against the switch's port_buffer) "
        "and its headroom",
        "Example:\n  aggctl pools --switch s1",
    ),
    "counters": (
        "drops per reason, aggregation events, packets per job and rank",
        "Read from the switch's P4Runtime counters. An admin reads every job and the\n"
        "switch-wide drops and events; a tenant the packets of its own jobs only. Example:\n"
        "  aggctl counters --job 3\n"
        "  aggctl counters --switch s1 --zero",
    ),
    "top": (TOP_SUMMARY, TOP_DETAILS),
    "release": (
        "end a job now: entries removed from the switch, pool freed",
        "Its workers' later calls answer FAILED_PRECONDITION. Example:\n  aggctl release 3",
    ),
    "shell": (
        "an interactive Python prompt with a P4Runtime session to one switch",
        "Connects with election id 1 (below the controller's), so it is a backup session that\n"
        "can read while the controller runs. Example:\n  aggctl shell --switch 127.0.0.1:9559",
    ),
}


def _common(top: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the command; only the top level sets defaults, so a
    subcommand does not reset an option given before it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--controller",
        default=DEFAULT_LISTEN if top else argparse.SUPPRESS,
        metavar="ADDR",
        help=f"address of the running controller (default {DEFAULT_LISTEN})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON instead of a table",
    )
    common.add_argument(
        "--timeout",
        type=float,
        default=10.0 if top else argparse.SUPPRESS,
        help="seconds to wait for the controller or the switch (default 10)",
    )
    common.add_argument(
        "--ca-file",
        type=Path,
        default=None if top else argparse.SUPPRESS,
        metavar="FILE",
        help=f"the CA that signed the controller's certificate (default ${CA_FILE_ENV})",
    )
    common.add_argument(
        "--credential-file",
        type=Path,
        default=None if top else argparse.SUPPRESS,
        metavar="FILE",
        help=f"file holding the operator credential (default ${OPERATOR_TOKEN_FILE_ENV}, "
        f"else the token in ${OPERATOR_TOKEN_ENV})",
    )
    common.add_argument(
        "--insecure",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="plaintext gRPC; serve: also start without TLS or operator credentials "
        "(tests and local use only; logged as a warning)",
    )
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common(top=False)
    p = argparse.ArgumentParser(
        prog="aggctl",
        description=DESCRIPTION,
        parents=[_common(top=True)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `aggctl COMMAND --help` for a command's options and an example.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str) -> argparse.ArgumentParser:
        summary, details = COMMANDS[name]
        return sub.add_parser(
            name,
            help=summary,
            description=f"{summary}.\n\n{details}",
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    serve_options(add("serve"))
    add("status")
    jobs = add("jobs")
    jobs.add_argument("--all", action="store_true", help="include the last 100 ended jobs")
    jobs.add_argument(
        "--ranks", action="store_true", help="also list each job's ranks and their leases"
    )
    _add_job_actions(add("job"), common)
    pools = add("pools")
    pools.add_argument("--switch", default="", help="only this switch")
    counters = add("counters")
    counters.add_argument("--switch", default="", help="only this switch")
    counters.add_argument("--job", type=int, default=0, help="only this job's packets")
    counters.add_argument(
        "--zero", action="store_true", help="also list reasons and events never counted"
    )
    add_top_options(add("top"))
    release = add("release")
    release.add_argument("job", type=int, metavar="JOB", help="the job id")
    _shell_options(add("shell"))
    return p


def _shell_options(shell: argparse.ArgumentParser) -> None:
    """`aggctl shell`: which switch, as which P4Runtime client."""
    shell.add_argument(
        "--switch", required=True, metavar="ADDR", help="the switch's P4Runtime address"
    )
    shell.add_argument("--device-id", type=int, default=0)
    shell.add_argument(
        "--election-id",
        type=int,
        default=1,
        help="election id (default 1: a backup while the controller, 10, is primary)",
    )


def _add_job_actions(job: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    actions = job.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a new job", parents=[common])
    create.add_argument("name", help="1..64 printable characters, for operators")
    create.add_argument(
        "--world-size",
        type=int,
        required=True,
        help="ranks, 1..32 (up to 256 on a tree of switches: docs/controller.md)",
    )
    create.add_argument("--codec", default="lossless", help="the workers' codec (default lossless)")
    create.add_argument(
        "--pool-size", type=int, default=0, help="switch slots (0: the controller's default)"
    )
    create.add_argument("--switch", default="", help="the switch (default: from the workers)")
    create.add_argument(
        "--token-file", type=Path, metavar="PATH", help="write the token here (mode 0600)"
    )
    show = actions.add_parser("show", help="one job and its ranks", parents=[common])
    show.add_argument("job", type=int, metavar="JOB", help="the job id")
    listing = actions.add_parser("list", help="running jobs", parents=[common])
    listing.add_argument("--all", action="store_true", help="include recently ended jobs")
    listing.add_argument("--ranks", action="store_true", help="also list each job's ranks")
    release = actions.add_parser("release", help="end a job now", parents=[common])
    release.add_argument("job", type=int, metavar="JOB", help="the job id")


def _write_secret(path: Path, text: str) -> None:
    """Create (or truncate) `path` readable by its owner only, then write `text`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")


def _job_action(args: argparse.Namespace, client: Any) -> int:
    """`aggctl job create|show|list|release`."""
    if args.action == "create":
        made = client.create_job(
            args.name, args.world_size, args.codec, pool_size=args.pool_size, switch=args.switch
        )
        if args.token_file:
            _write_secret(args.token_file, made.token)
            made.token = ""
        where = f"token in {args.token_file}" if args.token_file else f"token {made.token}"
        placed = f"on {made.switch}" if made.switch else "switch chosen when a worker joins"
        _print(args, made, f"created job {made.job_id} ({args.name}), {placed}; {where}")
        return 0
    if args.action == "release":
        return _release(args, client)
    jobs = client.list_jobs(args.action == "show" or args.all)
    if args.action == "list":
        _print(args, jobs, render_jobs(jobs.jobs, args.ranks))
        return 0
    job = next((j for j in jobs.jobs if j.job_id == args.job), None)
    if job is None:
        print(f"aggctl: NOT_FOUND: no job {args.job}", file=sys.stderr)
        return 1
    _print(args, job, render_jobs([job], True))
    return 0


def _release(args: argparse.Namespace, client: Any) -> int:
    job = client.release(args.job).job
    freed = (
        f"{job.pool_size} slots freed on {job_switches(job)}"
        if job.switch
        else "no slots were allocated"
    )
    _print(args, job, f"released job {job.job_id} ({job.name}): entries removed, {freed}")
    return 0


def to_dict(message: Any) -> dict[str, Any]:
    """Every field of a message in .proto order, defaults included, 64-bit counts as numbers
    (json_format would make them strings and put defaults last)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None:
            out[field.name] = [to_dict(v) for v in value] if field.is_repeated else to_dict(value)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out


def _print(args: argparse.Namespace, message: Any, text: str) -> None:
    if args.json:
        print(json.dumps(to_dict(message), indent=2))
    else:
        print(text)


class UsageError(Exception):
    """A command line that cannot work; the message says what to give instead."""


def client_security(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """The CA file (None: plaintext, chosen by --insecure or $HOMAGG_INSECURE=1) and the
    operator credential of a query command."""
    from homagg.api.tls import TlsError, plaintext_chosen

    try:
        token = operator_token(args.credential_file)
        plaintext = args.insecure or plaintext_chosen()
    except (SecretError, TlsError) as exc:
        raise UsageError(str(exc)) from None
    ca = None if args.insecure else ca_file(args.ca_file)
    if ca is None and not plaintext:
        raise UsageError(
            f"no CA to verify the controller with: give --ca-file FILE (or set ${CA_FILE_ENV}), "
            f"or --insecure (or ${INSECURE_ENV}=1) for a plaintext controller"
        )
    return ca, token


def _query(args: argparse.Namespace) -> int:
    from homagg.api.client import ControllerClient  # needs the generated modules
    from homagg.api.tls import TlsError

    ca, token = client_security(args)
    try:
        client = ControllerClient(args.controller, args.timeout, ca, token, insecure=ca is None)
    except TlsError as exc:
        raise UsageError(str(exc)) from None
    with client:
        if args.command == "status":
            st = client.status()
            _print(args, st, render_status(st))
        elif args.command == "jobs":
            resp = client.list_jobs(args.all)
            _print(args, resp, render_jobs(resp.jobs, args.ranks))
        elif args.command == "pools":
            resp = client.list_pools(args.switch)
            _print(args, resp, render_pools(resp.ranges, resp.ports))
        elif args.command == "counters":
            resp = client.counters(args.switch, args.job)
            _print(args, resp, render_counters(resp.switches, args.zero))
        elif args.command == "top":
            return run_top(args, client)
        elif args.command == "release":
            return _release(args, client)
        elif args.command == "job":
            return _job_action(args, client)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `aggctl` and `python -m homagg.control`."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "shell":
            from homagg.control.shell import run_shell
            from homagg.control.switch_connection import SwitchError

            try:
                run_shell(args.switch, args.device_id, args.election_id, args.timeout)
            except SwitchError as exc:
                print(f"aggctl: {exc}", file=sys.stderr)
                return 1
            return 0
        return _query(args)
    except grpc.RpcError as exc:
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code == "UNAVAILABLE":
            details = f"no controller answers at {args.controller} ({details})"
        elif code == "RESOURCE_EXHAUSTED" and details.startswith(CONCURRENCY_LIMIT_TEXT):
            details += CONCURRENCY_LIMIT_HINT
        print(f"aggctl: {code}: {details}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"aggctl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""`homagg-run` (python -m homagg.worker.job.launch): create a job on the controller, run a command
(torchrun ...) with what its ranks need in the environment, release the job when the
command ends, and exit with its status.

The ranks find HOMAGG_CONTROLLER, HOMAGG_JOB_ID and HOMAGG_TOKEN_FILE (a file only this
user can read; the token is never on a command line) and `homagg.attach` (or the homagg
backend) joins this job with the job's codec (--codec; HOMAGG_CODEC is set to it, and a
script's own codec= that differs is refused).

On several machines, run it once: around the torchrun of node rank 0 (rank 0 hands the job
to every rank through torch.distributed's store); on the other machines run torchrun alone,
with HOMAGG_CONTROLLER set. It refuses a torchrun of another node rank and a --world-size
that is not torchrun's, and says so when no rank joined the job.

The controller is verified against $HOMAGG_CA_FILE (the ranks inherit it; a controller
without TLS needs HOMAGG_INSECURE=1, which they inherit too, and warns); the job is
created with the operator credential of $HOMAGG_OPERATOR_TOKEN_FILE or
$HOMAGG_OPERATOR_TOKEN, which the ranks do not get.

Example:
  homagg-run --controller 10.0.0.100:50051 --codec lossless -- \\
    torchrun --nnodes 1 --nproc-per-node 2 examples/train_ddp.py

Two machines (on the second: HOMAGG_CONTROLLER=10.0.0.100:50051 torchrun ... --node-rank 1):
  homagg-run --controller 10.0.0.100:50051 -- torchrun --nnodes 2 --nproc-per-node 1 \\
    --node-rank 0 --master-addr 10.0.0.1 examples/train_ddp.py
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

# Nothing imported here imports torch (tests/worker/test_launch.py): the launcher starts
# without paying for it. Only reading a torchrun's options does
# (homagg/worker/job/torchrun_command.py).
from homagg.api.client import ControllerClient, release_job
from homagg.api.credentials import SecretError, ca_file, operator_token
from homagg.api.tls import TlsError
from homagg.environment import (
    CODEC_ENV,
    CONTROLLER_ENV,
    JOB_ID_ENV,
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)
from homagg.worker.codecs import CODEC_CHOICES, DEFAULT_CODEC
from homagg.worker.job.torchrun_command import plan_world


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="homagg-run",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--controller",
        default=os.environ.get(CONTROLLER_ENV, ""),
        help=f"controller address host:port (default ${CONTROLLER_ENV})",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="ranks of the job, in total (default: torchrun's --nnodes x --nproc-per-node)",
    )
    p.add_argument(
        "--codec",
        choices=CODEC_CHOICES,
        default=os.environ.get(CODEC_ENV) or DEFAULT_CODEC,
        help=f"the job's codec, which its ranks use (default ${CODEC_ENV}, else {DEFAULT_CODEC})",
    )
    p.add_argument("--pool-size", type=int, default=0, help="switch slots (0: controller default)")
    p.add_argument("--name", default="homagg-run", help="job name shown by aggctl")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run (torchrun)")
    return p


def _write_token(token: str) -> Path:
    fd, path = tempfile.mkstemp(prefix="homagg-token-")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return Path(path)


def _client(address: str) -> ControllerClient:
    """A client with this process's CA and operator credential (from the environment)."""
    return ControllerClient(address, 10.0, ca_file(), operator_token())


def _release(address: str, job_id: int) -> str:
    """End the job ("" when it is ended, also when every rank left first and the
    controller ended it then), else why not."""
    try:
        with _client(address) as client:
            return release_job(client.release, job_id)
    except (SecretError, TlsError) as exc:
        return str(exc)


def _tell_if_unused(address: str, job_id: int) -> None:
    """One line on stderr when no rank ever joined the job (the ranks made their own job,
    or never set one up); nothing when that cannot be learned."""
    try:
        with _client(address) as client:
            jobs = client.list_jobs(include_ended=True).jobs
    except (SecretError, TlsError, grpc.RpcError):
        return
    job = next((j for j in jobs if j.job_id == job_id), None)
    if job is not None and not job.workers:
        print(
            f"homagg-run: no rank joined job {job_id}: did rank 0 run under this homagg-run "
            "(the torchrun of node rank 0), and does the script call homagg.attach or "
            'init_process_group("homagg")?',
            file=sys.stderr,
        )


def run(args: argparse.Namespace) -> int:
    """Create, run, release; the command's exit status (128 + signal when it was killed)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("homagg-run: give the command after --, e.g. -- torchrun ...", file=sys.stderr)
        return 2
    if not args.controller:
        print(
            f"homagg-run: no controller: pass --controller or set {CONTROLLER_ENV}", file=sys.stderr
        )
        return 2
    try:
        world_size, notes = plan_world(args.world_size, command)
    except ValueError as exc:
        print(f"homagg-run: {exc}", file=sys.stderr)
        return 2
    job, code = _create_job(args, world_size)
    if job is None:
        return code
    token_file = _write_token(job.token)
    print(f"homagg-run: job {job.job_id} ({args.name}, {world_size} ranks)", flush=True)
    for note in notes:
        print(f"homagg-run: {note}", file=sys.stderr, flush=True)
    try:
        code = _run_command(command, _command_env(args, job.job_id, token_file))
    finally:
        token_file.unlink(missing_ok=True)
        _tell_if_unused(args.controller, job.job_id)
        problem = _release(args.controller, job.job_id)
        if problem:
            print(
                f"homagg-run: job {job.job_id} not released ({problem}); its lease ends it",
                file=sys.stderr,
            )
    return code if code >= 0 else 128 - code


def _create_job(args: argparse.Namespace, world_size: int) -> tuple[Any, int]:
    """The job made at the controller, or None and the exit status after saying why."""
    try:
        with _client(args.controller) as client:
            job = client.create_job(
                args.name, world_size=world_size, codec=args.codec, pool_size=args.pool_size
            )
    except (SecretError, TlsError) as exc:
        print(f"homagg-run: {exc}", file=sys.stderr)
        return None, 2
    except grpc.RpcError as exc:
        print(
            f"homagg-run: CreateJob failed at {args.controller}: {exc.code().name}: "
            f"{exc.details()}",
            file=sys.stderr,
        )
        return None, 1
    return job, 0


def _command_env(args: argparse.Namespace, job_id: int, token_file: Path) -> dict[str, str]:
    """The command's environment: the job for homagg.attach and the backend, the token by
    its file only, and no operator credential."""
    secret = (JOB_TOKEN_ENV, OPERATOR_TOKEN_ENV, OPERATOR_TOKEN_FILE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in secret}
    env.update(
        {
            CONTROLLER_ENV: args.controller,
            JOB_ID_ENV: str(job_id),
            JOB_TOKEN_FILE_ENV: str(token_file),
            CODEC_ENV: args.codec,
        }
    )
    return env


def _run_command(command: list[str], env: dict[str, str]) -> int:
    """Run the command to its end, passing SIGINT and SIGTERM on; its exit status."""
    proc = subprocess.Popen(command, env=env)
    previous = {
        s: signal.signal(s, lambda n, f: proc.send_signal(n))
        for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        return proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point."""
    return run(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

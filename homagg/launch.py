"""`homagg-run` (python -m homagg.launch): create a job on the controller, run a command
(torchrun ...) with what its ranks need in the environment, release the job when the
command ends, and exit with its status.

The ranks find HOMAGG_CONTROLLER, HOMAGG_JOB_ID and HOMAGG_TOKEN_FILE (a file only this
user can read; the token is never on a command line) and `homagg.attach` (or the homagg
backend) joins this job with the job's codec (--codec; HOMAGG_CODEC is set to it, and a
script's own codec= that differs is refused).
The controller is verified against $HOMAGG_CA_FILE (the ranks inherit it; a controller
without TLS needs HOMAGG_INSECURE=1, which they inherit too, and warns); the job is
created with the operator credential of $HOMAGG_OPERATOR_TOKEN_FILE or
$HOMAGG_OPERATOR_TOKEN, which the ranks do not get.

Example:
  homagg-run --controller 10.0.0.100:50051 --world-size 2 --codec lossless -- \\
    torchrun --nnodes 1 --nproc-per-node 2 examples/train_ddp.py
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

import grpc

from controller.client import ControllerClient
from controller.credentials import (
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
    SecretError,
    ca_file,
    operator_token,
)
from controller.tls import TlsError
from worker.attach import CODEC_CHOICES
from worker.codecs import DEFAULT_CODEC
from worker.job_setup import (
    ENV_CODEC,
    ENV_CONTROLLER,
    ENV_JOB_ID,
    release_job,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="homagg-run",
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--controller",
        default=os.environ.get(ENV_CONTROLLER, ""),
        help=f"controller address host:port (default ${ENV_CONTROLLER})",
    )
    p.add_argument("--world-size", type=int, required=True, help="ranks of the job, in total")
    p.add_argument(
        "--codec",
        choices=CODEC_CHOICES,
        default=os.environ.get(ENV_CODEC) or DEFAULT_CODEC,
        help=f"the job's codec, which its ranks use (default ${ENV_CODEC}, else {DEFAULT_CODEC})",
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


def run(args: argparse.Namespace) -> int:
    """Create, run, release; the command's exit status (128 + signal when it was killed)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("homagg-run: give the command after --, e.g. -- torchrun ...", file=sys.stderr)
        return 2
    if not args.controller:
        print(
            f"homagg-run: no controller: pass --controller or set {ENV_CONTROLLER}", file=sys.stderr
        )
        return 2
    try:
        with _client(args.controller) as client:
            job = client.create_job(
                args.name, world_size=args.world_size, codec=args.codec, pool_size=args.pool_size
            )
    except (SecretError, TlsError) as exc:
        print(f"homagg-run: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        print(
            f"homagg-run: CreateJob failed at {args.controller}: {exc.code().name}: "
            f"{exc.details()}",
            file=sys.stderr,
        )
        return 1
    token_file = _write_token(job.token)
    print(f"homagg-run: job {job.job_id} ({args.name}, {args.world_size} ranks)", flush=True)
    try:
        code = _run_command(command, _command_env(args, job.job_id, token_file))
    finally:
        token_file.unlink(missing_ok=True)
        problem = _release(args.controller, job.job_id)
        if problem:
            print(
                f"homagg-run: job {job.job_id} not released ({problem}); its lease ends it",
                file=sys.stderr,
            )
    return code if code >= 0 else 128 - code


def _command_env(args: argparse.Namespace, job_id: int, token_file: Path) -> dict[str, str]:
    """The command's environment: the job for homagg.attach and the backend, the token by
    its file only, and no operator credential."""
    secret = (JOB_TOKEN_ENV, OPERATOR_TOKEN_ENV, OPERATOR_TOKEN_FILE_ENV)
    env = {k: v for k, v in os.environ.items() if k not in secret}
    env.update(
        {
            ENV_CONTROLLER: args.controller,
            ENV_JOB_ID: str(job_id),
            JOB_TOKEN_FILE_ENV: str(token_file),
            ENV_CODEC: args.codec,
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

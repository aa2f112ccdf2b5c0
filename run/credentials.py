"""The secrets of one `make run`, made fresh in its directory: a CA and the controller's TLS
certificate for its address (homagg/control/pki.py), and two operator credentials (files only
root reads; the controller's configuration keeps their SHA-256 only): a tenant's, with
which rank 0 creates and releases the job, and an admin's, with which the run waits for the
controller and reads the switch's counters. Workers and aggctl get file names, never a
secret, on their command lines."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from homagg.api.credentials import ADMIN, TENANT, hash_token
from homagg.control.pki import make_pki
from homagg.environment import CA_FILE_ENV, OPERATOR_TOKEN_FILE_ENV

TENANT_NAME = "make-run"  # the operator names in the controller's configuration
# The tenant's running jobs at most: this run's and one a crash left (its slots: a tenant's
# default quota, TENANT_MAX_SLOTS; run/control.py's run_pool_size leaves room for both).
TENANT_MAX_RUN_JOBS = 2
ADMIN_NAME = "make-run-admin"


@dataclass(frozen=True)
class RunCredentials:
    """Where a run's CA, controller certificate and key, and operator credentials are."""

    ca: Path
    cert: Path
    key: Path
    tenant_token_file: Path
    admin_token_file: Path

    def controller_keys(self) -> dict[str, str]:
        """The [controller] keys that serve TLS."""
        return {"tls_cert": str(self.cert), "tls_key": str(self.key)}

    def operators(self) -> list[dict[str, object]]:
        """The [[operator]] tables: the tenant (room for this run's job and one a crash
        left) and the admin."""
        return [
            {"name": TENANT_NAME, "token_sha256": _digest(self.tenant_token_file)}
            | {"role": TENANT, "max_jobs": TENANT_MAX_RUN_JOBS},
            {"name": ADMIN_NAME, "token_sha256": _digest(self.admin_token_file), "role": ADMIN},
        ]

    def client_env(self, operator: bool) -> dict[str, str]:
        """The environment of a worker (the CA) or of rank 0 (also the tenant credential)."""
        env = {CA_FILE_ENV: str(self.ca)}
        if operator:
            env[OPERATOR_TOKEN_FILE_ENV] = str(self.tenant_token_file)
        return env

    def aggctl_args(self) -> list[str]:
        """aggctl's options naming the CA and the admin credential's file."""
        return ["--ca-file", str(self.ca), "--credential-file", str(self.admin_token_file)]


def _digest(token_file: Path) -> str:
    return hash_token(token_file.read_text().rstrip("\n"))


def _new_token(path: Path) -> Path:
    """A new random token in a new file only its owner reads."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    return path


def make_run_credentials(
    directory: Path, controller_ip: str, admin_directory: Path | None = None
) -> RunCredentials:
    """A new CA, a certificate for `controller_ip` and new tenant and admin credentials in
    `directory` (replacing a previous run's); the admin's in `admin_directory` when given (a
    place the workers do not see)."""
    pki = make_pki(directory, [controller_ip, "127.0.0.1"], days=2)
    tenant = _new_token(directory / "tenant.token")
    admin_directory = admin_directory or directory
    admin_directory.mkdir(parents=True, exist_ok=True)
    admin = _new_token(admin_directory / "admin.token")
    return RunCredentials(pki.ca, pki.cert, pki.key, tenant, admin)

"""The secrets of one `make run`, made fresh in its directory: a CA and the controller's TLS
certificate for its address (controller/pki.py), and an operator credential (a file only
root reads; the controller's configuration keeps its SHA-256 only). Workers and aggctl get
file names, never a secret, on their command lines."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from controller.credentials import CA_FILE_ENV, OPERATOR_TOKEN_FILE_ENV, hash_token
from controller.pki import make_pki

OPERATOR = "make-run"  # the operator name in the controller's configuration


@dataclass(frozen=True)
class RunCredentials:
    """Where a run's CA, controller certificate and key, and operator credential are."""

    ca: Path
    cert: Path
    key: Path
    operator_token_file: Path
    token_sha256: str

    def controller_keys(self) -> dict[str, str]:
        """The [controller] keys that serve TLS."""
        return {"tls_cert": str(self.cert), "tls_key": str(self.key)}

    def operators(self) -> list[dict[str, object]]:
        """The [[operator]] tables: this run's credential, for its job and one a crash left."""
        return [{"name": OPERATOR, "token_sha256": self.token_sha256, "max_jobs": 2}]

    def client_env(self, operator: bool) -> dict[str, str]:
        """The environment of a worker (the CA) or of rank 0 and aggctl (also the credential)."""
        env = {CA_FILE_ENV: str(self.ca)}
        if operator:
            env[OPERATOR_TOKEN_FILE_ENV] = str(self.operator_token_file)
        return env

    def aggctl_args(self) -> list[str]:
        """aggctl's options naming the CA and the credential file."""
        return ["--ca-file", str(self.ca), "--credential-file", str(self.operator_token_file)]


def make_run_credentials(directory: Path, controller_ip: str) -> RunCredentials:
    """A new CA, a certificate for `controller_ip` and a new operator credential in
    `directory` (replacing a previous run's)."""
    pki = make_pki(directory, [controller_ip, "127.0.0.1"], days=2)
    token_file = directory / "operator.token"
    token = secrets.token_urlsafe(32)
    token_file.unlink(missing_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return RunCredentials(pki.ca, pki.cert, pki.key, token_file, hash_token(token))

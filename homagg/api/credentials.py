"""Who may call the controller: the operator credentials (bearer tokens in gRPC metadata, kept
as SHA-256 digests and compared in constant time), their roles (an admin operates everything,
a tenant creates jobs and sees and releases its own) and quotas, and where clients read their
secrets from (a file or an environment variable, never a command-line argument)."""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from homagg.api.validation import hash_token  # token_sha256 in the configuration
from homagg.environment import (
    CA_FILE_ENV,
    JOB_TOKEN_ENV,
    JOB_TOKEN_FILE_ENV,
    OPERATOR_TOKEN_ENV,
    OPERATOR_TOKEN_FILE_ENV,
)
from homagg.wire.constants import NUM_SLOTS

METADATA_KEY = "authorization"  # gRPC metadata carrying "Bearer <operator token>"


ADMIN, TENANT = "admin", "tenant"
ROLES = (ADMIN, TENANT)
# A tenant's quotas unless its [[operator]] table says otherwise (an admin's: none): eight
# running jobs holding a quarter of a switch's slots, so no tenant takes a switch alone.
TENANT_MAX_JOBS = 8
TENANT_MAX_SLOTS = NUM_SLOTS // 4


@dataclass(frozen=True)
class Operator:
    """One operator credential, its role and its quotas (0: unlimited; the configuration
    gives a tenant TENANT_MAX_JOBS and TENANT_MAX_SLOTS unless it sets them).

    An ADMIN may make every call on every job; a TENANT may create jobs and list and
    release the jobs it created, and nothing else (docs/controller.md, Security)."""

    name: str
    token_sha256: str  # hex digest of the token; the token itself is never stored
    role: str = TENANT
    max_jobs: int = 0  # running jobs created with this credential
    max_slots: int = 0  # slots held by those jobs together

    @property
    def admin(self) -> bool:
        """Whether this credential may make every call on every job."""
        return self.role == ADMIN


def authenticate(operators: Sequence[Operator], token: str | None) -> Operator | None:
    """The operator whose digest matches `token`, compared in constant time; None if none."""
    if not token:
        return None
    digest = hash_token(token)
    found = None
    for op in operators:  # no early exit: the time taken does not say which one matched
        if hmac.compare_digest(digest, op.token_sha256):
            found = op
    return found


def bearer(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an 'authorization: Bearer TOKEN' metadata entry, if present."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata that presents `token` (nothing without one)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


class SecretError(ValueError):
    """A secret file that cannot be read or is empty; the message says which."""


def read_secret(path: Path | str | None, env: str, file_env: str) -> str | None:
    """A secret from `path`, else from the file named by $file_env, else from $env; None when
    none is given. A file's trailing newline is dropped; a token may begin with '-'."""
    path = path or os.environ.get(file_env) or None
    if path:
        try:
            text = Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SecretError(f"cannot read the secret file {path}: {exc.strerror}") from None
        if not text:
            raise SecretError(f"the secret file {path} is empty")
        return text
    return os.environ.get(env) or None


def operator_token(path: Path | str | None = None) -> str | None:
    """The operator credential of this client: --credential-file, $HOMAGG_OPERATOR_TOKEN_FILE
    or $HOMAGG_OPERATOR_TOKEN."""
    return read_secret(path, OPERATOR_TOKEN_ENV, OPERATOR_TOKEN_FILE_ENV)


def job_token(path: Path | str | None = None) -> str | None:
    """A worker's job token: --token-file, $HOMAGG_TOKEN_FILE or $HOMAGG_TOKEN."""
    return read_secret(path, JOB_TOKEN_ENV, JOB_TOKEN_FILE_ENV)


def ca_file(path: Path | str | None = None) -> Path | None:
    """The CA file to verify the controller with: `path`, else $HOMAGG_CA_FILE, else None."""
    value = path or os.environ.get(CA_FILE_ENV) or None
    return Path(value) if value else None

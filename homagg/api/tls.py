"""TLS of the controller's gRPC port: the server's certificate and key (read and checked to
belong together), the client's channel credentials, and the client's choice between TLS
and plaintext (explicit, never a fallback). homagg/control/pki.py makes the files."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import grpc

from homagg.api.credentials import ca_file
from homagg.environment import CA_FILE_ENV, INSECURE_ENV

log = logging.getLogger(__name__)


class TlsError(ValueError):
    """A certificate, key or CA file that cannot be read; the message names it."""


def _read(path: Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN" not in data:
        raise TlsError(f"the {what} {path} is not PEM")
    return data


def server_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    """The server side of TLS from a PEM certificate (chain) and its PEM key, checked to
    belong together (gRPC would only say that it failed to bind)."""
    key_pem, cert_pem = _read(key, "TLS key"), _read(cert, "TLS certificate")
    _check_pair(cert, cert_pem, key, key_pem)
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def _check_pair(cert: Path, cert_pem: bytes, key: Path, key_pem: bytes) -> None:
    """Refuse a key that is not the certificate's (skipped without `cryptography`)."""
    try:
        from cryptography import x509
    except ImportError:
        return
    from cryptography.hazmat.primitives import serialization

    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsError(f"the TLS certificate {cert} does not parse: {exc}") from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"the TLS key {key} does not parse (or has a password): {exc}") from None
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    mine = private.public_key().public_bytes(der, spki)
    if certificate.public_key().public_bytes(der, spki) != mine:
        raise TlsError(f"the TLS key {key} is not the key of the certificate {cert}")


def channel_credentials(ca: Path) -> grpc.ChannelCredentials:
    """A client's TLS: the controller's certificate must chain to this CA and name the host."""
    return grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA file"))


# -- the client's choice: TLS with a CA, or plaintext chosen explicitly ----------------------

_plaintext_warned = threading.Event()


def plaintext_chosen() -> bool:
    """Whether $HOMAGG_INSECURE chooses plaintext: "1" yes, unset, "" or "0" no."""
    value = os.environ.get(INSECURE_ENV, "")
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise TlsError(
        f"${INSECURE_ENV}={value!r}: set it to 1 to talk plaintext to a controller without TLS "
        "(tests and local use), or leave it unset"
    )


def client_ca(address: str, ca: Path | None = None, insecure: bool = False) -> Path | None:
    """The CA a client verifies the controller at `address` with, or None for plaintext.

    `ca`, else $HOMAGG_CA_FILE: TLS. Plaintext only when chosen: `insecure`, else
    $HOMAGG_INSECURE=1. Neither: TlsError saying what to set, never a silent plaintext channel
    (it would carry the job token and the operator credential readable)."""
    if ca is not None:
        if insecure:
            raise TlsError("give a CA file or choose plaintext (insecure), not both")
        return Path(ca)
    if insecure:
        return None
    found = ca_file()
    if found is not None:
        return found
    if plaintext_chosen():
        return None
    raise TlsError(
        f"no CA to verify the controller at {address} with: set ${CA_FILE_ENV} to the CA that "
        f"signed its certificate (ca_file=, --ca-file), or, for a controller without TLS "
        f"(tests and local use), choose plaintext with ${INSECURE_ENV}=1 (insecure=True, "
        "--insecure)"
    )


def warn_plaintext(address: str) -> None:
    """Log once per process that a client talks plaintext (what crosses the network)."""
    if not _plaintext_warned.is_set():
        _plaintext_warned.set()
        log.warning(
            "INSECURE: plaintext to the controller at %s (chosen by %s=1, insecure=True or "
            "--insecure): job tokens and the operator credential cross the network readable",
            address,
            INSECURE_ENV,
        )

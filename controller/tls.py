"""TLS of the controller's gRPC port: the server's certificate and key (read and checked to
belong together) and the client's channel credentials. controller/pki.py makes them."""

from __future__ import annotations

from pathlib import Path

import grpc


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

"""TLS of the controller's gRPC port: reading the server's certificate and key, the client's
channel credentials, and a small certificate authority (with the `cryptography` package) that
`make run` and the tests use to make a CA and a server certificate in a directory."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
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
    """The server side of TLS from a PEM certificate (chain) and its PEM key."""
    return grpc.ssl_server_credentials([(_read(key, "TLS key"), _read(cert, "TLS certificate"))])


def channel_credentials(ca: Path) -> grpc.ChannelCredentials:
    """A client's TLS: the controller's certificate must chain to this CA and name the host."""
    return grpc.ssl_channel_credentials(root_certificates=_read(ca, "CA file"))


@dataclass(frozen=True)
class Pki:
    """The files a private CA made: its certificate, and a server certificate and key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> object:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> object:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_pki(directory: Path, hosts: Sequence[str], days: int = 30) -> Pki:
    """A new CA (its key is not kept) and a certificate for `hosts` (IP addresses or names the
    clients dial) in `directory`: ca.crt, server.crt, server.key (mode 0600)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not hosts:
        raise ValueError("make_pki: at least one host name or address")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("homagg controller CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(pki.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return pki

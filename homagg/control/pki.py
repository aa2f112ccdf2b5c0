"""A small private certificate authority for `make run` and the tests: a fresh CA (its key is
thrown away) and a server certificate naming the addresses clients dial. It uses the
`cryptography` package when it is importable and the `openssl` command otherwise."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the package is optional (openssl otherwise)
    from cryptography import x509


@dataclass(frozen=True)
class Pki:
    """The files a private CA made: its certificate, and a server certificate and key."""

    ca: Path
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_pki(directory: Path, hosts: Sequence[str], days: int = 30, backend: str = "") -> Pki:
    """A new CA (its key is not kept) and a certificate for `hosts` (IP addresses or names the
    clients dial) in `directory`: ca.crt, server.crt, server.key (mode 0600). `backend`:
    "cryptography", "openssl", or "" for the first available."""
    if not hosts:
        raise ValueError("make_pki: at least one host name or address")
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    if backend == "openssl" or (not backend and not _have_cryptography()):
        _openssl_pki(pki, hosts, days)
    else:
        _cryptography_pki(pki, hosts, days)
    return pki


def _have_cryptography() -> bool:
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return False
    return True


def _private_file(path: Path) -> int:
    """A new file descriptor of `path`, mode 0600, replacing any earlier file."""
    path.unlink(missing_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def _cryptography_pki(pki: Pki, hosts: Sequence[str], days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

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
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    with os.fdopen(_private_file(pki.key), "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _openssl_pki(pki: Pki, hosts: Sequence[str], days: int) -> None:
    """The same files with the `openssl` command (OpenSSL 1.1.1 or later)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("neither the cryptography package nor the openssl command is here")
    san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
    ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    with tempfile.TemporaryDirectory() as tmp:
        ca_key, csr, ext = Path(tmp, "ca.key"), Path(tmp, "server.csr"), Path(tmp, "ext")
        ext.write_text(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n")
        os.close(_private_file(pki.key))  # 0600 before openssl writes the key into it
        serial = str(int.from_bytes(os.urandom(8), "big"))
        ca_subject = ["-subj", "/CN=homagg controller CA", "-days", str(days)]
        ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE,pathlen:0"]
        sign = [
            "-CA",
            str(pki.ca),
            "-CAkey",
            str(ca_key),
            "-set_serial",
            serial,
            "-days",
            str(days),
        ]
        steps = [
            ["genpkey", *ec, "-out", str(ca_key)],
            [
                "req",
                "-x509",
                "-new",
                "-key",
                str(ca_key),
                *ca_subject,
                *ca_ext,
                "-out",
                str(pki.ca),
            ],
            ["genpkey", *ec, "-out", str(pki.key)],
            ["req", "-new", "-key", str(pki.key), "-subj", f"/CN={hosts[0]}", "-out", str(csr)],
            ["x509", "-req", "-in", str(csr), *sign, "-extfile", str(ext), "-out", str(pki.cert)],
        ]
        for args in steps:
            done = subprocess.run([openssl, *args], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()[-300:]}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True

"""TLS certificates and SuperNode authentication keys for a deployment (``fedsim deploy certs``).

Written with the ``cryptography`` package, nothing hard-coded:

- ``ca.pem`` / ``ca.key`` — a self-signed certificate authority (ECDSA P-384);
- ``server.pem`` / ``server.key`` — the SuperLink's certificate, signed by the CA, valid for
  the given host names and IP addresses (subject alternative names);
- ``<node>`` / ``<node>.pub`` — one ECDSA P-384 key pair per SuperNode in OpenSSH format, what
  ``flower-supernode --auth-supernode-private-key`` reads and ``flwr supernode register``
  registers (public part);
- ``<node>-tls.pem`` / ``<node>-tls.key`` — a TLS certificate for the SuperNode's own local
  Runtime API (where its ClientApp connects), for ``localhost`` and ``127.0.0.1``, signed by
  the CA: so no node ever holds the SuperLink's private key.

Private keys are written with mode 0600. Validity is ``days`` (default 365).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsim.errors import FedsimError


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


_HOST = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _names(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            if not _HOST.fullmatch(h or "") or len(h) > 253:
                raise FedsimError(
                    f"--host {h!r} is neither an IP address nor a host name (letters, digits, "
                    f"hyphens and dots, e.g. superlink.example.org)"
                ) from None
            out.append(x509.DNSName(h))
    return out


def make_ca(
    out: Path, common_name: str = "fedsim deployment CA", days: int = 365
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Write ``ca.pem`` and ``ca.key`` into ``out``; return the key and certificate."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    (out / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(out / "ca.key", _pem_key(key))
    return key, cert


def make_server_cert(
    out: Path,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: list[str],
    days: int = 365,
    stem: str = "server",
) -> None:
    """Write ``<stem>.pem`` and ``<stem>.key``: a TLS server certificate for ``hosts``."""
    if not hosts:
        raise FedsimError("give at least one --host (the names and addresses clients use to reach the SuperLink)")
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    (out / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(out / f"{stem}.key", _pem_key(key))


def make_node_key(out: Path, name: str) -> Path:
    """Write the SuperNode key pair ``<name>`` (OpenSSH private) and ``<name>.pub``; return the
    public key's path."""
    if not name or "/" in name or name.startswith("."):
        raise FedsimError(f"node name {name!r}: use a plain file name like node-0")
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        out / name,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    pub = out / f"{name}.pub"
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return pub


def make_all(out: str | Path, hosts: list[str], nodes: int, days: int = 365) -> dict[str, list[str]]:
    """A CA, the SuperLink certificate for ``hosts``, and for each of ``nodes`` SuperNodes
    (``node-0`` …) an authentication key pair and a local TLS certificate, in ``out`` (created;
    existing files are refused, nothing is overwritten)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    planned = ["ca.pem", "ca.key", "server.pem", "server.key"] + [
        f for i in range(nodes) for f in (f"node-{i}", f"node-{i}.pub", f"node-{i}-tls.pem", f"node-{i}-tls.key")
    ]
    clash = [f for f in planned if (out / f).exists()]
    if clash:
        raise FedsimError(f"{out} already holds {clash[:4]}; choose an empty --out (nothing was overwritten)")
    if nodes < 0 or days < 1:
        raise FedsimError("--nodes must be ≥ 0 and --days ≥ 1")
    if not hosts:
        raise FedsimError("give at least one --host (the names and addresses clients use to reach the SuperLink)")
    _names(hosts)  # every host is checked before anything is written
    try:
        ca_key, ca_cert = make_ca(out, days=days)
        make_server_cert(out, ca_key, ca_cert, hosts, days)
        keys = [str(make_node_key(out, f"node-{i}")) for i in range(nodes)]
        for i in range(nodes):
            make_server_cert(out, ca_key, ca_cert, ["localhost", "127.0.0.1"], days, stem=f"node-{i}-tls")
    except BaseException:  # leave nothing half-made behind: a retry must find an empty folder
        for f in planned:
            (out / f).unlink(missing_ok=True)
        raise
    return {
        "ca": [str(out / "ca.pem")],
        "server": [str(out / "server.pem"), str(out / "server.key")],
        "node_public_keys": keys,
    }

"""HTTPS for the team services: their certificate, and what a client needs to verify it.

Where the services listen on an address other than loopback (``$NEXTLOC_SERVICES_HOST``), the Prefect
server and the MLflow tracking server speak TLS only, each through its own uvicorn (``--ssl-certfile``,
``--ssl-keyfile``): the credentials that every request carries as HTTP basic auth never cross the network
in clear, and plain ``http://`` on those ports gets no answer at all (the TLS handshake fails, the
connection closes; no login is ever asked). On 127.0.0.1 they stay plain HTTP unless the team gives its own
certificate.

Certificates, in ``.services/tls/`` (:attr:`services.layout.Services.tls_folder`; keys mode 0600):

* by default a private CA (``ca.pem``, ``ca.key``), generated once with the ``cryptography`` package, and
  a server certificate it signs (``server.pem``, ``server.key``) for the services' address, this machine's
  names, ``localhost`` and 127.0.0.1; the server certificate is made anew when the address changes or it
  nears its end (:data:`SERVER_DAYS`), the CA is kept (clients keep trusting it);
* ``$NEXTLOC_TLS_CERT`` / ``$NEXTLOC_TLS_KEY``: the team's own certificate (PEM, the chain after it) and
  key instead; ``$NEXTLOC_TLS_CA`` names the CA that clients are handed (without it they verify against
  their system's store). Given, they turn TLS on for loopback too.

Clients get the CA from ``nextloc services credentials`` (:func:`services.auth.credentials_text`) and
verify every request against it (:data:`tracking.access.CA_VARIABLES`); nothing here turns verification
off.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from pathlib import Path

from services.layout import Services
from services.processes import write_private

CERT_VARIABLE, KEY_VARIABLE, CA_VARIABLE = "NEXTLOC_TLS_CERT", "NEXTLOC_TLS_KEY", "NEXTLOC_TLS_CA"
CA_DAYS = 3650
#: Days a generated server certificate is valid (under the 398 that browsers allow a public one).
SERVER_DAYS = 397
_RENEW_DAYS = 30


def team_files() -> tuple[Path, Path] | None:
    """``($NEXTLOC_TLS_CERT, $NEXTLOC_TLS_KEY)``, or None when the team gives no certificate.

    Raises:
        ValueError: one is set without the other, or names no readable file.
    """
    cert, key = os.environ.get(CERT_VARIABLE), os.environ.get(KEY_VARIABLE)
    if not cert and not key:
        return None
    if not cert or not key:
        raise ValueError(f"{CERT_VARIABLE} and {KEY_VARIABLE} go together: set both or neither")
    for name, value in (
        (CERT_VARIABLE, cert),
        (KEY_VARIABLE, key),
        (CA_VARIABLE, os.environ.get(CA_VARIABLE)),
    ):
        if value and not Path(value).is_file():
            raise ValueError(f"{name}={value}: no such file")
    return Path(cert), Path(key)


def server_files(services: Services) -> tuple[Path, Path]:
    """The certificate and key the servers present: the team's, or the generated ones (made or renewed
    now where needed)."""
    team = team_files()
    if team is not None:
        return team
    folder = services.tls_folder
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca_cert, ca_key = _ensure_ca(folder)
    cert, key = folder / "server.pem", folder / "server.key"
    names = server_names(services.host)
    if not _current(cert, names):
        _issue_server(ca_cert, ca_key, names, cert, key)
    return cert, key


def ca_file(services: Services) -> Path | None:
    """The CA certificate that clients of the services verify against: ``$NEXTLOC_TLS_CA`` with a team's
    certificate (None without it: the system's store), else the generated ``ca.pem``; None without TLS."""
    if not services.tls:
        return None
    if team_files() is not None:
        return Path(os.environ[CA_VARIABLE]) if os.environ.get(CA_VARIABLE) else None
    return services.tls_folder / "ca.pem"


def server_names(host: str) -> list[str]:
    """What the server certificate names: the services' address, this machine's names, loopback's."""
    names = [host, socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"]
    return list(dict.fromkeys(n for n in names if n))


def _san(names: list[str]):
    from cryptography import x509

    entries = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _ensure_ca(folder: Path):
    """The private CA (certificate, key), generated once."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        return cert, serialization.load_pem_private_key(key_path.read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"nextloc services CA ({socket.gethostname()})")]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(cert, key, cert_path, key_path)
    return cert, key


def _usage(cert_sign: bool):
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _issue_server(ca_cert, ca_key, names: list[str], cert_path: Path, key_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_pair(cert, key, cert_path, key_path)


def _write_pair(cert, key, cert_path: Path, key_path: Path) -> None:
    """The key (0600) first, then the certificate (0644: it is public), each written atomically."""
    from cryptography.hazmat.primitives import serialization

    from nextloc.atomic import write_text_atomic

    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_private(key_path, pem.decode())
    write_text_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM).decode())
    cert_path.chmod(0o644)


def _current(cert_path: Path, names: list[str]) -> bool:
    """Whether ``cert_path`` exists, names every one of ``names`` and is valid for a while yet."""
    from cryptography import x509

    if not cert_path.is_file() or not cert_path.with_suffix(".key").is_file():
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    try:
        held = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(_san(names)) <= set(held) and left > datetime.timedelta(days=_RENEW_DAYS)

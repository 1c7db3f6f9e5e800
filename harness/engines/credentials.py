"""A cell's TLS credentials, made when an engine prepares a cell across hosts: a private key and a self-signed
certificate for that cell alone, one PEM file, 0600 in a 0700 folder. The engine hands hosts the file (Slurm: a
private folder on the file system the hosts share; JobSet: a Secret mounted as a volume) and tells them its path;
the content is never on a command line, in an environment or in a log. Every host presents the certificate and
trusts only it (harness.ranks.tls), so the file is the cell's membership: a process of another cell, or one that
cannot read the file, cannot join. Made with `cryptography`; nothing here is hand-made cryptography.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness import safedir

CREDENTIALS_FILE = "cell.pem"
# A cell longer than this cannot start a new connection: far above any cell's timeout.
VALID_FOR = datetime.timedelta(days=30)
CLOCK_SKEW = datetime.timedelta(minutes=10)  # hosts whose clocks are a little behind the engine's still accept it


def pem(cell_id: str) -> bytes:
    """A fresh key and its self-signed certificate for `cell_id`, PEM (the key first, unencrypted: it is
    guarded as a file)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"harness cell {cell_id}"[:64])])
    now = datetime.datetime.now(datetime.timezone.utc)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALID_FOR)
        # Its own trust anchor: both ends trust this one certificate and nothing else.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()) + certificate.public_bytes(serialization.Encoding.PEM)


def write(folder: Path, cell_id: str) -> Path:
    """The cell's credentials file in `folder` (this user's, made 0700; a link or another user's folder is
    refused, harness.safedir): created 0600 and exclusively in the folder's descriptor, so no one can have opened
    it before and it lands in no other folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with safedir.private(folder, "the folder of a cell's credentials") as folder_descriptor:
        descriptor = os.open(CREDENTIALS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=folder_descriptor)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem(cell_id))
    return folder / CREDENTIALS_FILE


@contextlib.contextmanager
def private_credentials(parent: Path, cell_id: str) -> Iterator[Path]:
    """The cell's credentials in a new 0700 folder under `parent`, removed (with the folder) on the way out."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="cell-", dir=parent))  # mkdtemp makes it 0700
    try:
        yield write(folder, cell_id)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

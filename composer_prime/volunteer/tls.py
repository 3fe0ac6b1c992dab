"""The pool's TLS: a self-signed certificate the run makes once, pinned by every join token (issue 36).

Beyond loopback nothing between a run and its volunteers travels in clear: the pool serves
HTTPS (`volunteers.tls`, on by default there). No certificate authority is involved: the run makes
its own key and certificate (`<output_dir>/orchestrator/pool-tls/`, kept across restarts), and
every token it hands out carries the certificate's sha256 after a dot (`SECRET.PIN`). A worker
joining over https accepts only that certificate (aiohttp's `Fingerprint`), so whatever the pool
answers (where the weights are, the dtype, the leases) comes from the run that invited it, and
nobody on the path reads the prompts or replays a node's requests. Why pinning rather than a
signed join answer: a signature would authenticate the join answer only, while the prompts and
every later request would still cross in clear; TLS covers all of them with one check.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def cert_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "orchestrator" / "pool-tls"


def ensure_cert(directory: Path) -> tuple[Path, Path]:
    """(certificate, key) in `directory`, made once (P-256, self-signed, ten years)."""
    cert, key = directory / "pool.crt", directory / "pool.key"
    if cert.exists() and key.exists():
        return cert, key
    directory.mkdir(parents=True, exist_ok=True)
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "composer-prime volunteer pool")])
    now = datetime.datetime.now(datetime.timezone.utc)
    made = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650)).sign(private, hashes.SHA256()))
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
    return cert, key


def pin(cert: Path) -> str:
    """The certificate's sha256 (of its DER), hex: what a token pins."""
    der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def pinned_token(secret: str, output_dir: Path) -> str:
    """`SECRET.PIN`: the secret the pool checks, and the certificate the worker accepts."""
    cert, _ = ensure_cert(cert_dir(output_dir))
    return f"{secret}.{pin(cert)}"


def split_token(token: str) -> tuple[str, str | None]:
    """(secret, pin or None); a secret is URL-safe base64, which has no dot."""
    secret, _, fingerprint = token.strip().partition(".")
    return secret, fingerprint or None

"""Who may talk to whom once a process listens beyond loopback: the keys, the token, the rule.

On loopback nothing is required (unless keys are configured). A process that binds beyond it
refuses to start without them, in one line saying how to make them:

- the orchestrator → trainer ZMQ channel uses CURVE (encrypted; the trainer accepts only the
  orchestrator's public key, the orchestrator checks the trainer's);
- the inference server's control routes (`/update_weights`) want `Authorization: Bearer <token>`,
  the token from `inference.token` in the keys directory or the COMPOSER_PRIME_TOKEN variable.

One keys directory (`auth.keys_dir`) holds everything; `rl` makes it under `<output_dir>/keys/`
when it launches, `composer-prime keys make --out DIR` for hand-started processes. Each machine
needs only its own process's files:

    trainer       trainer.key_secret, orchestrator.key, inference.token, trainer.ed25519
    orchestrator  orchestrator.key_secret, trainer.key
    inference     inference.token, trainer.ed25519.pub (SHARDCAST only)
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

TOKEN_ENV = "COMPOSER_PRIME_TOKEN"
TOKEN_FILE = "inference.token"
SIGNING_KEY = "trainer.ed25519"  # SHARDCAST: the trainer signs every step with it
HOW = "make keys with `composer-prime keys make --out DIR` and pass `--auth.keys_dir DIR` (`rl` does both itself)"


def refuse(msg: str) -> NoReturn:
    """The one-line refusal of a process that would start unprotected (exit code 2, no traceback)."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; a wildcard ("*", "0.0.0.0") or any other name is beyond."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def zmq_host(address: str) -> str:
    """The host of a ZMQ endpoint; ipc:// and inproc:// never leave the machine."""
    if not address.startswith("tcp://"):
        return "localhost"
    return urlsplit(address).hostname or address[len("tcp://"):].rsplit(":", 1)[0]


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path.with_suffix(path.suffix + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path.with_suffix(path.suffix + ".tmp"), path)


def ensure_signing_key(path: Path) -> str:
    """The SHARDCAST signing key at `path` (created if missing) and its public half beside it as
    `<path>.pub` (hex), which is what inference nodes and relays are given; returns that hex."""
    from composer_prime.transports.weights.shardcast.manifest import load_or_create_key, public_hex

    public = public_hex(load_or_create_key(path))
    pub = path.with_name(path.name + ".pub")
    if not pub.exists() or pub.read_text().strip() != public:
        pub.write_text(public + "\n")
    return public


def public_key(value: str) -> str:
    """The trainer's SHARDCAST public key, given as 64 hex digits or as the file holding them."""
    def is_hex(text: str) -> bool:
        return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())

    if is_hex(value):
        return value
    if not Path(value).is_file():
        refuse(f"weight_broadcast.public_key {value!r}: neither 64 hex digits nor a file holding them; {HOW}")
    text = Path(value).read_text().strip()
    if not is_hex(text):
        refuse(f"weight_broadcast.public_key {value}: the file does not hold an ed25519 public key (64 hex digits)")
    return text


def make_keys(out: Path) -> Path:
    """Create whatever of the keys directory is missing (never replaces a key); returns `out`."""
    import zmq.auth

    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    for name in ("trainer", "orchestrator"):
        if not (out / f"{name}.key_secret").exists():
            zmq.auth.create_certificates(out, name)
            os.chmod(out / f"{name}.key_secret", 0o600)
    if not (out / TOKEN_FILE).exists():
        _write_secret(out / TOKEN_FILE, secrets.token_urlsafe(32).encode())
    ensure_signing_key(out / SIGNING_KEY)
    return out


def token(keys_dir: Path | None) -> str | None:
    """The control-route token: COMPOSER_PRIME_TOKEN, else `inference.token` in the keys directory."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    if keys_dir is None:
        return None
    path = Path(keys_dir) / TOKEN_FILE
    if not path.exists():
        refuse(f"auth.keys_dir {keys_dir}: no {TOKEN_FILE}; {HOW}")
    return path.read_text().strip()


def curve_keys(keys_dir: Path, me: str, peer: str) -> tuple[bytes, bytes, bytes]:
    """(my public, my secret, the peer's public) CURVE keys, z85, from the keys directory."""
    import zmq.auth

    mine, theirs = Path(keys_dir) / f"{me}.key_secret", Path(keys_dir) / f"{peer}.key"
    for path in (mine, theirs):
        if not path.exists():
            refuse(f"auth.keys_dir {keys_dir}: no {path.name}; {HOW}")
    public, secret = zmq.auth.load_certificate(mine)
    return public, secret, zmq.auth.load_certificate(theirs)[0]


def require(what: str, host: str, protected: bool, risk: str) -> None:
    """Refuse to listen beyond loopback unprotected: `what` set to `host` would let anyone who reaches it `risk`."""
    if not protected and not is_loopback(host):
        refuse(f"{what} = {host} listens beyond loopback, where anyone who reaches it could {risk}; {HOW}")

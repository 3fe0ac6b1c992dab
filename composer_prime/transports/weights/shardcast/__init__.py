"""SHARDCAST weight broadcast: trainer (origin) → relays → inference nodes, signed and verified.

`Origin` publishes each step; `Relay` mirrors and re-serves; `Downloader` fetches and verifies.
The wire layout is the `shardcast` package's, so its relays and clients interoperate.
"""

from composer_prime.transports.weights.shardcast.client import Downloader, DownloadError
from composer_prime.transports.weights.shardcast.manifest import (
    Manifest,
    VerificationError,
    load_or_create_key,
    public_hex,
)
from composer_prime.transports.weights.shardcast.origin import Origin, model_hash
from composer_prime.transports.weights.shardcast.relay import Relay

__all__ = ["Downloader", "DownloadError", "Manifest", "VerificationError", "load_or_create_key", "public_hex",
           "Origin", "model_hash", "Relay"]

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The project's tiny default model (built once, then cached by content hash)."""
    from composer_prime.model.tiny import ensure_tiny_model

    return ensure_tiny_model()

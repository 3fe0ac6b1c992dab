import os
from pathlib import Path

import pytest

from composer_prime.utils.net import free_port  # noqa: F401 - tests import it from here

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The project's tiny default model (built once, then cached by content hash)."""
    from composer_prime.model.tiny import ensure_tiny_model

    return ensure_tiny_model()

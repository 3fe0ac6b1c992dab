"""Helpers for tests that run `rl`: the quickstart's arguments at test size, metrics rows, and each process's last words."""

import json
from pathlib import Path

import httpx

from tests.conftest import free_port

STEPS = 50


def rl_args(run: Path, *extra: str) -> list[str]:
    return ["@", "configs/quickstart.toml", "--inference.engine", "hf", "--output_dir", str(run), "--max_steps", str(STEPS),
            "--inference.port", str(free_port()), "--transport.address", f"tcp://127.0.0.1:{free_port()}",
            "--orchestrator.eval.interval", "100", "--orchestrator.eval.num_tasks", "96", *extra]


def rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def log_tails(run: Path) -> str:
    """What each process said last: the message of a failed assertion on a run started with its output hidden."""
    return "\n".join(f"== {p.name}\n{p.read_text()[-1500:]}" for p in sorted((run / "logs").glob("*.log")))


def probe_ids(model_dir: Path) -> list[int]:
    """The prompt `probe` sends, as token ids (to score its answer under other weights)."""
    from transformers import AutoTokenizer

    from composer_prime.utils.chat import encode_chat

    return encode_chat(AutoTokenizer.from_pretrained(model_dir),
                       [{"role": "system", "content": "Reverse the letters."}, {"role": "user", "content": "h g c"}])


def probe(url: str, model_dir: Path) -> tuple[list[int], list[float]]:
    """One seeded request to an inference server: its tokens and their log-probs (compared before and after training)."""
    ids = probe_ids(model_dir)
    r = httpx.post(f"{url}/inference/v1/generate", timeout=60,
                   json={"token_ids": ids, "sampling_params": {"max_tokens": 12, "temperature": 1.0, "seed": 5}})
    choice = r.json()["choices"][0]
    return choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]

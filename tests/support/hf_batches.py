"""Nine requests, four of them joining mid-decode, through the embedded engine's continuous batch in
the calling thread: what the tests of its step variants (op by op, recorded, compiled) compare."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from composer_prime.inference.engines.hf.graphs import bucket, scheduler_for
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler

ROWS, LENGTH = 16, 128
BUDGETS = {5, 12, 19, 26}  # the four max_tokens the requests take turns with


def load(model_dir, dtype: torch.dtype, device: str) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTENTION).to(device).eval()


def run(model, graphs: str = "off", bucketed: bool = False) -> dict[int, tuple[list[int], list[float]]]:
    """Each request's (tokens, log-probs) with the step run as `graphs` says (graphs.scheduler_for);
    `bucketed`: op by op, but on the shapes the recorded and compiled variants run."""
    batch = DeviceBatch(SlotModel(model, ROWS, LENGTH), ROWS, LENGTH, model.device)
    scheduler = (Scheduler(batch, shape=lambda n, w: bucket(n, w, ROWS, LENGTH)) if bucketed
                 else scheduler_for(batch, graphs))
    got = {}

    def ask(i: int) -> None:
        params = SamplingParams(max_tokens=5 + 7 * (i % 4), seed=i, temperature=0.3 + 0.2 * (i % 4),
                                top_p=0.9 if i % 3 == 0 else 1.0, stop_token_ids=(-1,))
        prompt = [(5 * i + 3 * j) % 200 + 3 for j in range(4 + 3 * (i % 5))]
        scheduler.submit(Request(prompt, params, lambda g: got.__setitem__(i, (g.token_ids, g.logprobs))))

    with torch.no_grad():
        for i in range(5):
            ask(i)
        for _ in range(4):
            scheduler.tick()
        for i in range(5, 9):
            ask(i)
        scheduler.drain()
    return got

"""Ask teachers only where the student is unsure: the student's own NLL of what it did.

    nll(step) = - (1/|y|) * sum_t log pi_student(y_t | history, y_<t)      y = the recorded action

scored by our inference server serving the student (`/inference/v1/score`, the prefill route the
distill channel uses), on the token ids `traces.dataset.render` gives (the ones a pair would be
trained on). A step at or below `threshold` nats per token is one the student was sure of: no
teacher is asked about it. The replay counts these (`gated_out`), so the saving is measured
against asking everyone everything (`--gating all` without a gate).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx

from composer_prime.traces.dataset import as_text, render
from composer_prime.traces.record import Step, assistant_message

if TYPE_CHECKING:  # a type only: `composer-prime --help` builds its parser from this package without transformers
    from transformers import PreTrainedTokenizerBase


class StudentGate:
    def __init__(self, url: str, tok: PreTrainedTokenizerBase, threshold: float) -> None:
        self.url, self.tok, self.threshold = url.rstrip("/"), tok, threshold

    async def nll(self, http: httpx.AsyncClient, step: Step) -> float:
        """Mean NLL per token of the step's action under the served student."""
        ids, start = render(self.tok, [as_text(m) for m in step.messages], as_text(assistant_message(step.action)))
        r = await http.post(f"{self.url}/inference/v1/score", json={"token_ids": ids, "start": start, "top_k": 1}, timeout=120)
        r.raise_for_status()
        lps = r.json()["token_logprobs"]
        return -sum(lps) / max(1, len(lps))

    async def unsure(self, http: httpx.AsyncClient, step: Step) -> bool:
        return await self.nll(http, step) > self.threshold

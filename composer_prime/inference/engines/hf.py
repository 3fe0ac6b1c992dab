"""Embedded transformers engine: the fallback for machines without vLLM, same contract.

Requests that arrive together are decoded together: a background task gathers whatever is
queued (up to `max_batch`), left-pads the prompts and runs one KV-cached decode loop in which
every step is a handful of batch-wide tensor ops (`sampling.py`). Each request samples with
its own seeded generator, so a seed reproduces a completion whatever else shares its batch.
Scoring bypasses the batching loop: one exact float32 forward per request, under the same lock.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation, Scores
from composer_prime.inference.engines.base import check_score_args
from composer_prime.inference.engines.sampling import sample_step


class HFEngine:
    def __init__(self, model_path: str, model_name: str, max_model_len: int = 512, max_batch: int = 64) -> None:
        self.model_path, self.model_name, self.max_model_len, self.max_batch = model_path, model_name, max_model_len, max_batch
        self._queue: asyncio.Queue = asyncio.Queue()
        self._lock = asyncio.Lock()  # decoding and weight swaps never overlap
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).eval()
        self.pad_id = self.model.config.pad_token_id or 0
        self._worker = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._worker:
            self._worker.cancel()

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_token_ids)}) + max_tokens ({params.max_tokens}) exceeds max_model_len {self.max_model_len}")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((prompt_token_ids, params, future))
        return await future

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        check_score_args(token_ids, start, top_k, temperature, self.max_model_len)
        vocab = self.model.config.vocab_size
        if top_k > vocab or not all(0 <= t < vocab for t in token_ids):
            raise ValueError(f"top_k ({top_k}) and every token id must fit the vocabulary of {vocab}")
        async with self._lock:  # never scores half-swapped weights
            return await asyncio.to_thread(self._score, token_ids, start, top_k, temperature)

    @torch.no_grad()
    def _score(self, token_ids: list[int], start: int, top_k: int, temperature: float) -> Scores:
        # The last token predicts nothing we score, so it is left out; logits only where scored.
        ids = torch.tensor([token_ids[:-1]])
        logits = self.model(input_ids=ids, logits_to_keep=len(token_ids) - start).logits[0]
        logp = torch.log_softmax(logits.float() / temperature, -1)
        actual = logp.gather(-1, torch.tensor(token_ids[start:])[:, None]).squeeze(-1)
        top = logp.topk(top_k, -1)  # sorted descending
        return Scores(actual.tolist(), top.indices.tolist(), top.values.tolist())

    async def load_weights(self, path: str) -> None:
        """Read and check the whole step before touching the model: a bad step changes nothing."""
        file = Path(path) / "model.safetensors"
        state = await asyncio.to_thread(load_file, str(file))  # raises on a missing or corrupt file
        own = self.model.state_dict()
        missing = set(own) - set(state) - ({"lm_head.weight"} if self.model.config.tie_word_embeddings else set())
        if missing or any(state[k].shape != own[k].shape for k in state if k in own) or set(state) - set(own):
            raise ValueError(f"{file}: tensors do not match the served model (missing {sorted(missing)[:3]})")
        async with self._lock:
            self.model.load_state_dict(state, strict=False)
            if self.model.config.tie_word_embeddings:
                self.model.tie_weights()

    async def _loop(self) -> None:
        while True:
            items = [await self._queue.get()]
            await asyncio.sleep(0.005)  # let a burst of concurrent requests arrive
            while not self._queue.empty() and len(items) < self.max_batch:
                items.append(self._queue.get_nowait())
            async with self._lock:
                try:
                    results = await asyncio.to_thread(self._decode, [(p, s) for p, s, _ in items])
                    for (_, _, fut), res in zip(items, results):
                        fut.set_result(res)
                except Exception as e:  # noqa: BLE001 - report to the callers, keep serving
                    for _, _, fut in items:
                        fut.set_exception(e)

    @torch.no_grad()
    def _decode(self, reqs: list[tuple[list[int], SamplingParams]]) -> list[Generation]:
        # A group's G completions share one prompt: prefill each distinct prompt once and fan
        # its KV cache out to the rows that continue it (prefill is most of the work on short replies).
        unique: dict[tuple[int, ...], int] = {}
        rows = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p, _ in reqs])
        prompts = list(unique)
        n, width = len(reqs), max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding keeps every row's last token aligned
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        out.past_key_values.reorder_cache(rows)
        logits, attn, pos = out.logits[rows, -1], attn[rows], pos[rows]
        gens = [torch.Generator().manual_seed(s.seed if s.seed is not None else random.getrandbits(63)) for _, s in reqs]
        temps = torch.tensor([s.temperature for _, s in reqs])
        top_p = torch.tensor([s.top_p for _, s in reqs])
        budget = torch.tensor([s.max_tokens for _, s in reqs])
        vocab = self.model.config.vocab_size
        stops = torch.zeros((n, vocab), dtype=torch.bool)
        for i, (_, s) in enumerate(reqs):
            stops[i, [t for t in s.stop_token_ids if 0 <= t < vocab]] = True
        done = torch.zeros(n, dtype=torch.bool)
        stopped = torch.zeros(n, dtype=torch.bool)
        lengths = budget.clone()
        toks, lps = [], []
        for t in range(int(budget.max())):
            nxt, lp = sample_step(logits, temps, top_p, gens, ~done)
            nxt = nxt.masked_fill(done, self.pad_id)
            toks.append(nxt)
            lps.append(lp)
            hit = ~done & stops.gather(1, nxt[:, None]).squeeze(1)
            stopped |= hit
            lengths = torch.where(hit, t + 1, lengths)
            done |= hit | (budget <= t + 1)
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones((n, 1), dtype=torch.long)], 1)
            pos = pos[:, -1:] + 1
            out = self.model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos,
                             past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1]
        all_toks, all_lps = torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist()
        return [Generation(list(p), all_toks[i][:k], all_lps[i][:k], "stop" if stopped[i] else "length")
                for i, ((p, _), k) in enumerate(zip(reqs, lengths.tolist()))]

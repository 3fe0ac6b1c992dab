"""Embedded transformers engine: the fallback for machines without vLLM, and the GPU engine where
vLLM cannot go. Same contract as any engine (engines/base.py).

The model sits on `inference.device` in `inference.dtype` with a static KV cache (cache.py) and
is driven by one thread running the continuous batch (scheduler.py): requests join between decode
steps, finished ones leave, and each samples with its own seed so that a seed reproduces a
completion whatever else is decoded with it (model/sampling.py). On CUDA the decode step is replayed as
CUDA graphs (graphs.py), compiled first with `graphs = "compile"` (on the CPU: compiled only). That thread is the only one that touches the model: scoring and weight
swaps are jobs it runs between two steps, a swap only once no request is in flight, so no request
is decoded by two sets of weights and no score sees half-swapped ones.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import torch
from transformers import AutoModelForCausalLM

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation, Scores
from composer_prime.inference import devices
from composer_prime.inference.engines.base import check_score_args
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.inference.engines.hf.cache import ATTENTION, SlotModel
from composer_prime.inference.engines.hf.copies import Copies, read_step
from composer_prime.inference.engines.hf.graphs import scheduler_for
from composer_prime.inference.engines.hf.scheduler import GATHER_S, Request

log = logging.getLogger(__name__)


def _reply(loop: asyncio.AbstractEventLoop, future: asyncio.Future):
    """A callback for the serving thread that settles `future` on its event loop."""
    def settle(result: object) -> None:
        def set_it() -> None:
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        loop.call_soon_threadsafe(set_it)
    return settle


class HFEngine:
    sampler = "seeded"  # its draws replay from (seed, token index) alone: what a volunteer's submission says
    audits_in_place = True  # `states` of the served version and dtype: on the served model, between two steps
    def __init__(self, model_path: str, model_name: str, max_model_len: int = 512, max_batch: int | None = None,
                 device: str = "auto", dtype: str = "auto", graphs: str = "auto", keep_states: bool = False) -> None:
        """`keep_states`: keep each drawn token's last hidden state (batch.py), for `generate_with_states`."""
        self.model_path, self.model_name, self.max_model_len = model_path, model_name, max_model_len
        self.keep_states = keep_states
        self.device, self.dtype, self.graphs = devices.resolve(device, dtype, graphs)
        self.max_batch = max_batch or (256 if self.device == "cuda" else 64)
        self._thread: threading.Thread | None = None
        self.copies = Copies(model_path, self.device, max_model_len)  # for audits in other weights or dtypes

    async def start(self) -> None:
        await asyncio.to_thread(self.load)
        self._thread = threading.Thread(target=self._serve, name="hf-engine", daemon=True)
        self._thread.start()
        log.info(f"embedded engine on {self.device} ({self.dtype}, graphs {self.graphs}), "
                 f"{self.max_batch} rows x {self.max_model_len} tokens")

    def load(self) -> None:
        """Load the model and build the batch; `start` does this, then serves from a thread (a benchmark
        may instead drive `self.scheduler` itself)."""
        if self.device == "cpu":
            torch.set_num_threads(1)  # DESIGN.md: one thread per process; two decoded 7x slower under contention
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, self.dtype),
                                                     attn_implementation=ATTENTION)
        self.model = model.to(self.device).eval()
        self.slots = SlotModel(self.model, self.max_batch, self.max_model_len)
        self.batch = DeviceBatch(self.slots, self.max_batch, self.max_model_len, self.device, self.keep_states)
        self.scheduler = scheduler_for(self.batch, self.graphs, GATHER_S)

    def _serve(self) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                self.scheduler.run()
        except BaseException as e:  # noqa: BLE001 - a server whose engine is gone must not go on answering /health
            log.critical(f"error: the embedded engine's thread died ({type(e).__name__}: {e}); this server stops")
            logging.shutdown()
            os._exit(1)  # its callers' futures would wait forever; whoever started it (rl) names it and stops the run

    async def stop(self) -> None:
        if self._thread is not None:
            self.scheduler.stop()
            await asyncio.to_thread(self._thread.join, 60)

    async def _call(self, fn, exclusive: bool = False):
        future = asyncio.get_running_loop().create_future()
        self.scheduler.call(fn, _reply(asyncio.get_running_loop(), future), exclusive)
        return await future

    def _check_ids(self, token_ids: list[int]) -> None:
        vocab = self.model.config.vocab_size
        if not all(0 <= t < vocab for t in token_ids):  # on CUDA an out-of-range id would kill the process
            raise ValueError(f"every token id must be in [0, {vocab}), the vocabulary of {self.model_name}")

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        return (await self._generate(prompt_token_ids, params))[0]

    async def generate_with_states(self, prompt_token_ids: list[int], params: SamplingParams) -> tuple[Generation, torch.Tensor]:
        """The generation and the last hidden state [tokens, hidden] (bfloat16, on the CPU) that gave each
        of its tokens' logits, kept while decoding: an engine started with `keep_states` only."""
        if not self.keep_states:
            raise ValueError("this engine keeps no hidden states: create it with keep_states=True")
        return await self._generate(prompt_token_ids, params)

    async def _generate(self, prompt_token_ids: list[int], params: SamplingParams) -> tuple[Generation, torch.Tensor | None]:
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt_token_ids)}) + max_tokens ({params.max_tokens}) exceeds max_model_len {self.max_model_len}")
        if not prompt_token_ids:
            raise ValueError("the prompt has no token ids")
        self._check_ids(prompt_token_ids)
        future = asyncio.get_running_loop().create_future()
        request = Request(list(prompt_token_ids), params, _reply(asyncio.get_running_loop(), future))
        self.scheduler.submit(request)
        return await future, request.states  # the scheduler sets `states` before it replies

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        check_score_args(token_ids, start, top_k, temperature, self.max_model_len)
        vocab = self.model.config.vocab_size
        if top_k > vocab:
            raise ValueError(f"top_k ({top_k}) and every token id must fit the vocabulary of {vocab}")
        self._check_ids(token_ids)
        return await self._call(lambda: self._score(token_ids, start, top_k, temperature))

    @torch.no_grad()
    def _score(self, token_ids: list[int], start: int, top_k: int, temperature: float) -> Scores:
        # The last token predicts nothing we score, so it is left out; logits only where scored.
        logits = self.slots.score_logits(token_ids[:-1], len(token_ids) - start)
        logp = torch.log_softmax(logits.float() / temperature, -1)
        actual = logp.gather(-1, torch.tensor(token_ids[start:], device=logp.device)[:, None]).squeeze(-1)
        top = logp.topk(top_k, -1)  # sorted descending
        return Scores(actual.tolist(), top.indices.tolist(), top.values.tolist())

    async def states(self, token_ids: list[int], start: int, weights: str | None = None,
                     dtype: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Last hidden states and logits predicting token_ids[start:] (one prefill, returned on the CPU,
        logits in float32): what a TOPLOC proof commits to, and what a sampling check replays. With
        `weights` (a step directory, or the base model's) or a `dtype` other than the served one, on a
        copy holding those weights in that dtype (copies.py): an older version's audit, or a float32
        audit of bfloat16-served weights (config/volunteers.py)."""
        check_score_args(token_ids, start, 1, 1.0, self.max_model_len)
        self._check_ids(token_ids)
        if weights is None and dtype in (None, self.dtype):
            @torch.no_grad()
            def run() -> tuple[torch.Tensor, torch.Tensor]:
                hidden, logits = self.slots.states(token_ids, start)
                return hidden.cpu(), logits.float().cpu()
            return await self._call(run)
        if weights is None:
            raise ValueError("a dtype other than the served one needs the served weights' directory")
        return await asyncio.to_thread(self.copies.states, token_ids, start, weights, dtype or self.dtype)

    async def load_weights(self, path: str) -> None:
        """Read and check the whole step before touching the model: a bad step changes nothing. The
        tensors are copied into the served ones (same storage: recorded CUDA graphs stay valid)."""
        state = await asyncio.to_thread(read_step, path, self.model)
        await self._call(lambda: self._swap(state), exclusive=True)

    @torch.no_grad()
    def _swap(self, state: dict[str, torch.Tensor]) -> None:
        params = self.model.state_dict()
        for name, tensor in state.items():
            params[name].copy_(tensor)  # cast to the served dtype, moved to the device, in place

"""A run's volunteer side in one event loop, for the tests and benchmarks/volunteers.py: the real
pool (volunteer/pool.py) and validator, its nodes joining a real InferenceClient's pool,
against a real trusted inference server; real workers (volunteer/worker.py) in the same loop,
each with its own embedded engine; and the scripted dishonest workers of the red-team suite,
each a `Worker` with one step overridden."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
from pathlib import Path

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors.torch import save_file

from composer_prime.config.models import OrchestratorConfig
from composer_prime.config.volunteers import WorkerConfig
from composer_prime.contract.volunteer import Submission, node_id  # noqa: F401 - tests take node_id from here
from composer_prime.orchestrator.client import InferenceClient
from composer_prime.volunteer.pool import VolunteerPool
from composer_prime.utils.net import free_port
from composer_prime.volunteer.worker import Worker

TOKEN = "join-token-for-tests"


@contextlib.asynccontextmanager
async def pool_run(trusted_url: str, model: str, run_dir: Path, **volunteers):
    """(client, pool): the pool listening on loopback, the client reading the trusted server."""
    cfg = OrchestratorConfig(model=model, inference_urls=[trusted_url], output_dir=run_dir,
                             volunteers={"enabled": True, "port": free_port(), "open": True, "join_token": TOKEN, "heartbeat_s": 0.5,
                                         "lease_s": 20.0, **volunteers})
    client = InferenceClient(cfg.inference_urls, model)
    pool = VolunteerPool.build(cfg, client.pool, client.audit, lambda: client.served)
    await client.versions()
    await pool.start()
    try:
        yield client, pool
    finally:
        await pool.stop()
        await client.close()


@contextlib.asynccontextmanager
async def working(worker: Worker):
    """`worker` running (joined, engine loaded) until the block ends."""
    task = asyncio.create_task(worker.run())
    try:
        while worker.engine is None or worker.engine._thread is None:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        yield worker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def worker_config(pool, tmp: Path, name: str, **over) -> WorkerConfig:
    return WorkerConfig(**{"join": f"http://127.0.0.1:{pool.cfg.port}", "token": TOKEN, "key_path": tmp / f"{name}.key",
                           "work_dir": tmp / name, "device": "cpu", "dtype": "float32", "max_model_len": 512, **over})


def make_worker(cls: type[Worker], pool, tmp: Path, name: str, **over) -> Worker:
    return cls(worker_config(pool, tmp, name, **over), Ed25519PrivateKey.generate())


async def lease_once(client: InferenceClient, pool, worker: Worker, prompt: list[int], seed: int, max_tokens: int = 40,
                     stop: tuple[int, ...] = ()):
    """One lease to `worker` (stopping at `stop`: none by default, so a completion fills `max_tokens`),
    its submission and the validator's verdict."""
    from composer_prime.config.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, seed=seed, stop_token_ids=stop)
    lease, sub = await pool.lease(worker.node, prompt, params, client.served)
    verdict = await pool.validator.check(lease, sub)
    pool.verdict(sub.node_id, verdict)
    return lease, sub, verdict


def one_step(model_dir: Path, root: Path, texts: list[str], version: int = 1, lr: float = 1e-4) -> Path:
    """weights/step_<version> under `root`, as a run's trainer publishes it (transports/weights/filesystem.py):
    the model at `model_dir` after one step of the trainer's own optimizer (model/optim.py: AdamW with the
    quickstart's [trainer.optim] at `lr`, its 1e-4 once warmed up; gradients clipped at `max_norm` as
    train_step clips them) on a real loss: the next-token cross-entropy of `texts` (the `ce` channel's). A
    fresh AdamW's step is sign-like: every weight with a gradient moves by `lr`. A worker still holding
    `model_dir` is then exactly one trainer step behind."""
    from transformers import AutoTokenizer

    from composer_prime.config.models import OptimConfig
    from composer_prime.model.optim import build_optimizer, set_lr
    from composer_prime.trainer.model import load_model
    from composer_prime.transports.weights.filesystem import write_step

    model, tok = load_model(str(model_dir)), AutoTokenizer.from_pretrained(model_dir)
    cfg = OptimConfig(lr=lr, warmup_steps=10)  # configs/quickstart.toml: lr 1e-4
    optim = build_optimizer(model.parameters(), cfg)
    set_lr(optim, cfg, cfg.warmup_steps, 150)  # the first step past the warm-up: `lr`
    optim.zero_grad(set_to_none=True)
    for text in texts:
        ids = torch.tensor([tok(text)["input_ids"]])
        (model(input_ids=ids, labels=ids).loss / len(texts)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_norm)
    optim.step()
    return write_step(root, version, model.state_dict(), Path(model_dir), model.config.tie_word_embeddings, torch.float32)


# -- the red team: each overrides one step of an honest worker ---------------------------------
def perturb(engine, scale: float, seed: int = 0) -> None:
    """Every weight w += scale * std(w) * N(0, 1), in place (relative noise of `scale`)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in engine.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.float().std() * scale)


class OtherWeights(Worker):
    """The right architecture with other weights: `scale` relative noise on whatever it holds (a
    different model at 1). A vLLM worker's prefill engine is perturbed and vLLM loads the same
    weights from a step directory."""

    scale = 1e-2
    perturbed = -1  # the version whose weights it last perturbed

    async def generate(self, lease):
        if self.perturbed != self.version:  # while it holds the weights: no swap can come between
            self.perturbed = self.version
            engine = getattr(self.engine, "prefill", self.engine)
            await engine._call(lambda: perturb(engine, self.scale), exclusive=True)
            if engine is not self.engine:
                step = self.cfg.work_dir / "perturbed" / f"v{self.version}"
                step.mkdir(parents=True, exist_ok=True)
                for f in Path(self.model_dir).glob("*.json"):  # config and tokenizer files, as a step has them
                    shutil.copy(f, step)
                save_file({k: v.contiguous() for k, v in engine.model.state_dict().items()
                           if k != "lm_head.weight" or not engine.model.config.tie_word_embeddings},
                          str(step / "model.safetensors"), metadata={"format": "pt"})
                await self.engine.vllm.load_weights(str(step))
        return await super().generate(lease)


class OldWeights(Worker):
    """Never loads new weights but claims the leased version: against a server at v1 written by
    `one_step`, exactly one trainer step behind."""

    async def load(self, version, deadline):
        self.version = version


class ClaimsOldVersion(Worker):
    """Never loads new weights and says so."""

    async def load(self, version, deadline):
        pass


class ClaimsNewerVersion(Worker):
    """Works honestly, then claims a version one above the lease: one the pool never leased, which no
    trusted server can check (once a free abort)."""

    def submission(self, lease, gen, proofs):
        sub = super().submission(lease, gen, proofs)
        return dataclasses.replace(sub, weight_version=sub.weight_version + 1).signed(self.key)


class Substitutes(Worker):
    """Puts other tokens in place of its draws, log-probs and proofs rebuilt honestly over them (one
    prefill): with `tamper`, one token mid-completion; with `pick`, the likeliest tokens (generated at
    temperature 0) where the lease asks for draws. Only the sampling check can see either."""

    tamper = pick = False

    async def generate(self, lease):
        if not (self.tamper or self.pick):
            return await super().generate(lease)
        t = lease.sampling.get("temperature", 1.0)
        gen, _ = await super().generate(dataclasses.replace(lease, sampling={**lease.sampling, "temperature": 0.0})
                                        if self.pick else lease)
        ids = list(gen.token_ids)
        if self.tamper:
            ids[len(ids) // 2] = (ids[len(ids) // 2] + 1) % 300
        engine = getattr(self.engine, "prefill", self.engine)  # a vLLM worker's prefill engine
        hidden, logits = await engine.states(lease.prompt_ids + ids, len(lease.prompt_ids))
        lp = torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()
        return dataclasses.replace(gen, token_ids=ids, logprobs=lp), hidden


class TamperedTokens(Substitutes):
    tamper = True


class PicksTokens(Substitutes):
    pick = True


class ChangedPrompt(Worker):
    """Generates for another prompt (one token changed); signs the leased prompt's hash, or with
    `own_hash` its real prompt's."""

    own_hash = False

    async def work(self, lease):
        other = list(lease.prompt_ids)
        other[len(other) // 2] = (other[len(other) // 2] + 1) % 300
        sub = await super().work(dataclasses.replace(lease, prompt_ids=other))
        return sub if self.own_hash else dataclasses.replace(sub, prompt_sha256=lease.prompt_sha256).signed(self.key)


class CutsShort(Worker):
    """Keeps the first `keep` tokens of its honest completion (by default half of it; log-probs and proofs
    of that prefix, all honest): a length of the worker's choosing, below the budget, without its stop token."""

    keep: int | None = None

    async def generate(self, lease):
        gen, states = await super().generate(lease)
        keep = self.keep if self.keep is not None else max(1, len(gen.token_ids) // 2)
        return dataclasses.replace(gen, token_ids=gen.token_ids[:keep], logprobs=gen.logprobs[:keep],
                                   finish_reason="length"), states[:keep]


class RunsPastStop(Worker):
    """Ignores the lease's stop tokens and draws on to `max_tokens`: every token is still the seeded
    draw at its index, so log-probs, proofs and replay all hold."""

    async def generate(self, lease):
        return await super().generate(dataclasses.replace(lease, sampling={**lease.sampling, "stop_token_ids": [-1]}))


class Proofs(Worker):
    """Sends `edit(proofs)` instead of its proofs: truncated, missing, null or another rollout's."""

    edit = staticmethod(lambda proofs: proofs)

    def submission(self, lease, gen, proofs):
        return super().submission(lease, gen, self.edit(proofs))


class WrongLogprobs(Worker):
    """Claims log-probs its sampler did not have."""

    def submission(self, lease, gen, proofs):
        return super().submission(lease, dataclasses.replace(gen, logprobs=[-0.05] * len(gen.token_ids)), proofs)


def forged(sub: Submission, victim: str) -> Submission:
    """A submission in `victim`'s name, signed with another key."""
    return dataclasses.replace(sub, node_id=victim).signed(Ed25519PrivateKey.generate())


"""An inference engine that costs nothing, behind the real inference server, and a batch sink:
what benchmarks/orchestrator_ceiling.py runs the orchestrator against, so that only the
orchestrator's and the server's own per-request work is left to measure.

    python benchmarks/support/instant.py serve --port P   # the real HTTP server (inference/server.py)
    python benchmarks/support/instant.py sink --address A # receives batches, acknowledges each one

`InstantEngine` meets the engine contract (inference/engines/base.py): for each request it
answers at once with one of the completions it drew at start, picked by the request's seed
(reverse-text's letters, so the environment's reward spreads within a group and dynamic sampling
keeps every group), one log-prob per token, ending with the stop token unless the budget cuts it. It is injected into
`ServerState` as serve.py injects the engines it selects; every route, the request models and
the answer's JSON are the server's own. The sink stands where the trainer's rank 0 does: a
DEALER bound to the batch address, receiving each batch's bytes (undecoded: decoding is the
trainer's cost) and answering with the trainer's announcement of the next step, which is how
the benchmark knows a batch arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Generation, Scores


class InstantEngine:
    """Answers every generate request at once with one of `kinds` completions drawn in advance
    (reverse-text's letters, the stop token about once in `stop_every`), picked by the request's
    seed; cut to `max_tokens`."""

    model_name = "instant"
    max_model_len = 4096
    dtype = None

    def __init__(self, vocab: list[int], stop: int, kinds: int = 1024, length: int = 64, stop_every: int = 12) -> None:
        rng = random.Random(0)
        self.drawn: list[tuple[list[int], list[float]]] = []
        for _ in range(kinds):
            ids = [rng.choice(vocab) for _ in range(length)]
            if (cut := next((i for i in range(1, length) if rng.randrange(stop_every) == 0), None)) is not None:
                ids[cut:] = [stop]
            self.drawn.append((ids, [-rng.random() * 4 for _ in ids]))

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        ids, logprobs = self.drawn[hash((params.seed, len(prompt_token_ids))) % len(self.drawn)]
        ids, logprobs = ids[: params.max_tokens], logprobs[: params.max_tokens]
        stopped = ids[-1] in params.stop_token_ids
        return Generation(prompt_token_ids, ids, logprobs, "stop" if stopped else "length")

    async def score(self, token_ids: list[int], start: int, top_k: int, temperature: float = 1.0) -> Scores:
        n = len(token_ids) - start
        return Scores([-1.0] * n, [[t] * top_k for t in token_ids[start:]], [[-1.0] * top_k] * n)

    async def load_weights(self, path: str) -> None:
        pass


def letters(tok) -> list[int]:
    """reverse-text's alphabet as the tokenizer writes it after a space, and the space itself."""
    return sorted({t for c in "abcdefgh" for t in tok.encode(f" {c}", add_special_tokens=False)})


def serve(port: int) -> None:
    import uvicorn

    from composer_prime.inference.server import ServerState, build_app
    from composer_prime.model.resolve import resolve_model

    base = resolve_model("tiny")
    state = ServerState(None, base)  # the tokenizer the server loads gives the engine its letters and stop token
    state.engine = InstantEngine(letters(state.tokenizer), state.tokenizer.eos_token_id)
    try:  # what serve.py holds its server in (a baseline from before it had none)
        from composer_prime.utils.proc import long_lived
    except ImportError:
        long_lived = contextlib.nullcontext
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))  # serve.py's
    with long_lived():
        asyncio.run(server.serve())


def sink(address: str) -> None:
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.bind(address)
    received = 0
    while True:
        sock.recv(copy=False)
        received += 1  # the trainer's announcement, its "expect" counting the batches received
        sock.send(msgpack.packb({"trainer": "sink", "expect": received}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("role", choices=["serve", "sink"])
    p.add_argument("--port", type=int)
    p.add_argument("--address")
    a = p.parse_args()
    sys.exit(serve(a.port) if a.role == "serve" else sink(a.address))

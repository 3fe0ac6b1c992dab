"""The embedded engine's continuous batch (scheduler.py over batch.py) with a stand-in model: the
next-token logits are a fixed table indexed by (last token, position), so every expected sequence
is computed here token by token with the sampler alone."""

from collections import deque

import pytest
import torch

from composer_prime.config.sampling import SamplingParams
from composer_prime.inference.engines.hf.batch import DeviceBatch
from composer_prime.model.sampling import sample, stream_keys
from composer_prime.inference.engines.hf.scheduler import Request, Scheduler

VOCAB, LENGTH = 12, 64
TABLE = torch.randn((VOCAB, LENGTH, VOCAB), generator=torch.Generator().manual_seed(0)) * 2


class TableModel:
    """Logits after token t at position j: TABLE[t, j] (its "hidden state", the head the identity).
    Records the rows it is asked to move."""

    vocab_size = hidden_size = VOCAB

    def __init__(self) -> None:
        self.moves: list[tuple[list[int], list[int]]] = []
        self.prefills: list[int] = []
        self.fail_next = False

    def prefill(self, prompts: list[list[int]], dst: list[int], src: list[int]) -> torch.Tensor:
        self.prefills.append(len(prompts))
        return torch.stack([TABLE[p[-1], len(p) - 1] for p in prompts])

    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, b: int, w: int) -> torch.Tensor:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("device lost")
        assert w == int(pos.max()) + 1  # the scheduler's own count of positions, never read from the device
        return TABLE[tokens, pos]

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def move(self, src: list[int], dst: list[int], width: int) -> None:
        self.moves.append((src, dst))


def alone(prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    """The completion token by token, one row, straight from the sampler."""
    out, token, pos = [], prompt[-1], len(prompt) - 1
    for count in range(params.max_tokens):
        t, _ = sample(TABLE[token, pos][None], torch.tensor([params.temperature]), torch.tensor([params.top_p]),
                      stream_keys([params.seed]), torch.tensor([count]), params.top_p < 1)
        token, pos = t.item(), pos + 1
        out.append(token)
        if token in params.stop_token_ids:
            return out, "stop"
    return out, "length"


def serve(rows: int = 8):
    model = TableModel()
    scheduler = Scheduler(DeviceBatch(model, rows, LENGTH))
    answers: dict[str, object] = {}

    def submit(name: str, prompt: list[int], **params) -> None:
        scheduler.submit(Request(prompt, SamplingParams(**params), lambda g: answers.__setitem__(name, g)))
    return model, scheduler, answers, submit


def test_requests_decoded_together_get_their_own_completion_and_finished_rows_are_filled():
    model, scheduler, answers, submit = serve()
    reqs = {"a": ([1, 2, 3], dict(max_tokens=3, seed=1)), "b": ([4, 5], dict(max_tokens=9, seed=2)),
            "c": ([1, 2, 3], dict(max_tokens=5, seed=3, top_p=0.8)), "d": ([7], dict(max_tokens=7, seed=4, temperature=0.5))}
    for name, (prompt, params) in reqs.items():
        submit(name, prompt, stop_token_ids=(-1,), **params)
    scheduler.drain()
    for name, (prompt, params) in reqs.items():
        g = answers[name]
        assert (g.token_ids, g.finish_reason) == alone(prompt, SamplingParams(**params)) and g.prompt_token_ids == prompt
        assert len(g.logprobs) == params["max_tokens"]
    assert model.prefills == [3]  # one prefill, of the three distinct prompts
    assert scheduler.steps == 8  # the longest request: its first token at prefill, 8 more steps
    # a (row 0) finishes after 2 steps: d (row 3) moves into its hole; c, then the last row, leaves none;
    # d (now row 0) finishes: b (row 1) moves into it
    assert model.moves == [([3], [0]), ([1], [0])]
    assert scheduler.live == [] and scheduler.batch.finished(8) == list(range(8))


def test_a_request_joining_mid_decode_gets_exactly_what_it_gets_alone():
    model, scheduler, answers, submit = serve()
    submit("first", [3, 4], max_tokens=12, seed=5, stop_token_ids=(-1,))
    for _ in range(4):
        scheduler.tick()
    submit("joiner", [3, 4], max_tokens=6, seed=6, stop_token_ids=(-1,))
    scheduler.tick()
    assert [r.seed for r in scheduler.live] == [5, 6]  # it joined between two steps, beside the first
    scheduler.drain()
    assert answers["first"].token_ids == alone([3, 4], SamplingParams(max_tokens=12, seed=5))[0]
    assert answers["joiner"].token_ids == alone([3, 4], SamplingParams(max_tokens=6, seed=6))[0]
    assert model.prefills == [1, 1] and scheduler.steps == 11


def test_a_stop_token_ends_a_request_and_a_full_batch_makes_the_rest_wait():
    params = SamplingParams(max_tokens=40, seed=8, stop_token_ids=(5,))
    want, reason = alone([2], params)
    assert reason == "stop" and want[-1] == 5 and len(want) < 40  # this seed draws token 5 early
    model, scheduler, answers, submit = serve(rows=2)
    submit("long", [1], max_tokens=30, seed=1, stop_token_ids=(-1,))
    submit("stops", [2], max_tokens=40, seed=8, stop_token_ids=(5,))
    submit("waits", [3], max_tokens=4, seed=9, stop_token_ids=(-1,))
    scheduler.tick()
    assert len(scheduler.live) == 2 and len(scheduler.waiting) == 1  # two rows: the third waits
    scheduler.drain()
    assert (answers["stops"].token_ids, answers["stops"].finish_reason) == (want, "stop")
    assert answers["waits"].token_ids == alone([3], SamplingParams(max_tokens=4, seed=9))[0]
    assert answers["long"].finish_reason == "length" and len(answers["long"].token_ids) == 30


def test_a_swap_waits_for_requests_in_flight_and_holds_back_new_ones():
    model, scheduler, answers, submit = serve()
    events = []
    submit("before", [1], max_tokens=4, seed=1, stop_token_ids=(-1,))
    scheduler.tick()
    scheduler.call(lambda: events.append(("swap", len(scheduler.live), scheduler.steps)), lambda r: None, exclusive=True)
    scheduler.call(lambda: events.append(("score", len(scheduler.live), scheduler.steps)), lambda r: None)
    submit("after", [1], max_tokens=2, seed=2, stop_token_ids=(-1,))
    scheduler.drain()
    # the score ran at the next boundary; the swap once "before" was done, and "after" only then
    assert events == [("score", 1, 1), ("swap", 0, 3)]
    assert len(answers["before"].token_ids) == 4 and len(answers["after"].token_ids) == 2 and scheduler.steps == 4


def test_the_engine_thread_reads_the_queues_only_under_their_lock():
    """Requests and jobs are appended by the server's threads: the engine's thread must not iterate them
    unlocked (it once read `jobs` bare in tick(), and died of "deque mutated during iteration" under a
    relay run's load, leaving a server with no engine)."""
    model, scheduler, answers, submit = serve()

    class Guarded(deque):
        def __iter__(self):
            assert scheduler.cond._is_owned(), "iterated without the scheduler's lock"
            return super().__iter__()

    scheduler.jobs, scheduler.waiting = Guarded(), Guarded()
    submit("x", [1], max_tokens=3, seed=1, stop_token_ids=(-1,))
    scheduler.call(lambda: None, lambda r: None, exclusive=True)
    scheduler.tick()  # the exclusive job runs first (nothing live), then x is admitted
    scheduler.call(lambda: None, lambda r: None, exclusive=True)
    scheduler.drain()  # now it waits for x: every boundary reads the jobs again
    assert len(answers["x"].token_ids) == 3 and not scheduler.jobs


def test_a_failing_step_fails_the_requests_in_flight_and_the_engine_keeps_serving():
    model, scheduler, answers, submit = serve()
    submit("x", [1], max_tokens=5, seed=1, stop_token_ids=(-1,))
    submit("y", [2], max_tokens=5, seed=2, stop_token_ids=(-1,))
    model.fail_next = True
    scheduler.tick()
    assert [str(answers[k]) for k in "xy"] == ["device lost", "device lost"] and scheduler.live == []
    submit("z", [1], max_tokens=5, seed=1, stop_token_ids=(-1,))
    scheduler.drain()
    assert answers["z"].token_ids == alone([1], SamplingParams(max_tokens=5, seed=1))[0]


def test_waiting_requests_are_admitted_together_once_the_oldest_has_waited():
    model = TableModel()
    scheduler = Scheduler(DeviceBatch(model, 8, LENGTH), gather_s=60.0)
    params = SamplingParams(max_tokens=6, stop_token_ids=(-1,))
    first = Request([1], params, lambda g: None)
    scheduler.submit(first)
    scheduler.tick()
    assert (len(scheduler.live), scheduler.steps) == (0, 0)  # not yet due
    first.arrived -= 60
    scheduler.tick()
    assert (len(scheduler.live), scheduler.steps) == (1, 1)
    late = [Request([2 + i], params, lambda g: None) for i in range(2)]
    for r in late:
        scheduler.submit(r)
    scheduler.tick()
    assert (len(scheduler.live), len(scheduler.waiting), scheduler.steps) == (1, 2, 2)  # decoding goes on meanwhile
    late[0].arrived -= 60
    scheduler.tick()
    assert (len(scheduler.live), model.prefills) == (3, [1, 2])  # both in one prefill, the younger with the older


@pytest.mark.parametrize("seed", [None, 3])
def test_no_seed_draws_one_and_a_seed_is_kept(seed):
    r = Request([1], SamplingParams(seed=seed), lambda g: None)
    assert (r.seed == 3) if seed == 3 else (0 <= r.seed < 2**63)


def test_an_engine_whose_thread_dies_ends_its_server(monkeypatch, caplog):
    """The engine's thread raising ends the process with one logged line, where the server had stayed up
    answering /health with no engine behind it (its requests waiting forever)."""
    from composer_prime.inference.engines.hf import engine as hf_engine

    model, scheduler, answers, submit = serve()
    scheduler.run = lambda: (_ for _ in ()).throw(RuntimeError("deque mutated during iteration"))
    exits = []
    monkeypatch.setattr(hf_engine.os, "_exit", exits.append)
    it = hf_engine.HFEngine.__new__(hf_engine.HFEngine)
    it.scheduler = scheduler
    it._serve()
    assert exits == [1]
    assert [r.getMessage() for r in caplog.records if r.levelname == "CRITICAL"] == [
        "error: the embedded engine's thread died (RuntimeError: deque mutated during iteration); this server stops"]

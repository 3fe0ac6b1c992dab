"""A scripted policy at the inference seam: it returns the token ids of fixed replies, so a test knows exactly which tokens the model produced;
and a tool-calc orchestrator whose rollouts it plays."""

import asyncio

from composer_prime.config import OrchestratorConfig
from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion


class ScriptedPolicy:
    def __init__(self, tok, replies: list[str]) -> None:
        self.tok, self.replies, self.prompts = tok, list(replies), []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.replies.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
        cut = ids[: params.max_tokens]  # like an engine: the budget caps the reply
        return Completion(cut, [-0.5] * len(cut), "stop" if cut == ids else "length", 7 - len(self.prompts), "scripted")


WRONG = '<tool_call>{"name": "calculator", "arguments": {"expr": "874 + 786"}}</tool_call>'


RIGHT = '<tool_call>{"name": "calc", "arguments": {"expr": "874 + 786"}}</tool_call>'


def orchestrator(tiny_model_dir, **extra):
    """An orchestrator on one tool-calc task (the real tokenizer and environment); `extra`: more config."""
    from composer_prime.orchestrator.orchestrator import Orchestrator  # transformers and verifiers: only when used

    return Orchestrator(OrchestratorConfig.model_validate({
        "model": str(tiny_model_dir), "batch_size": 2, "group_size": 2, "seq_len": 512, "eval": {"num_tasks": 1},
        "sampling": {"max_tokens": 128},
        "envs": [{"id": "tool-calc", "args": {"num_tasks": 1}, "eval_args": {"num_tasks": 1}, "max_turns": 3}], **extra}))


def scripted(o, replies: list[str]):
    """One rollout of `o`'s task with the model's turns scripted."""
    from composer_prime.orchestrator.rollouts import rollout

    env = o.envs[0]
    return asyncio.run(rollout(ScriptedPolicy(o.tok, replies), o.tok, "tool-calc", env.train[0], o.cfg.sampling,
                               o.cfg.seq_len, 3, 0, asyncio.Semaphore(1)))

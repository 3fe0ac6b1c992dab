"""A scripted policy at the inference seam: it returns the token ids of fixed replies, so a test knows exactly which tokens the model produced."""

from composer_prime.config.sampling import SamplingParams
from composer_prime.contract.inference import Completion


class ScriptedPolicy:
    def __init__(self, tok, replies: list[str]) -> None:
        self.tok, self.replies, self.prompts = tok, list(replies), []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.replies.pop(0), add_special_tokens=False) + [self.tok.eos_token_id]
        cut = ids[: params.max_tokens]  # like an engine: the budget caps the reply
        return Completion(cut, [-0.5] * len(cut), "stop" if cut == ids else "length", 7 - len(self.prompts))


WRONG = '<tool_call>{"name": "calculator", "arguments": {"expr": "874 + 786"}}</tool_call>'


RIGHT = '<tool_call>{"name": "calc", "arguments": {"expr": "874 + 786"}}</tool_call>'

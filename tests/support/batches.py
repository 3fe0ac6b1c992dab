"""A small valid batch, as the orchestrator sends it."""

from composer_prime.contract.batches import Batch, Sample


def make_batch(step: int = 3) -> Batch:
    s = Sample(input_ids=[1, 2, 3], sampling_logprobs=[0.0, -0.25, -1.5], advantages=[0.0, 0.75, 0.75],
               channel_weights={"rl": [0.0, 1.0, 1.0]}, temperature=0.7, policy_version=2)
    return Batch(step=step, samples=[s, s])

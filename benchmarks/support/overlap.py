"""The async overlap against its bound, from the same run at max_async_level 1 and 0 (vs_trl, real_model).

At max_async_level 0 nothing overlaps: a step is generation (T_gen: generating and scoring,
building the batch, sending it) then training (T_train: packing, forward, backward, optimizer,
checkpoint, writing and publishing the weights, which includes inference loading them). The
asynchronous run can at best hide the shorter behind the longer, so the speed-up is bounded by
(T_gen + T_train) / max(T_gen, T_train); achieved is the synchronous step time over the asynchronous one.
"""

from __future__ import annotations

GEN = ("generate_and_score_s", "build_batch_s", "send_s")  # orchestrator phases of `utils.report.time_breakdown`
TRAIN = ("pack_s", "forward_s", "backward_s", "optim_s", "other_compute_s", "checkpoint_s", "publish_s")  # trainer's


def overlap(asynchronous: dict, synchronous: dict) -> dict:
    """T_gen and T_train (from the synchronous breakdown), the bound, the speed-up achieved and its
    fraction of the bound; {} when either breakdown is empty (too few steps)."""
    if not asynchronous or not synchronous:
        return {}
    t_gen = sum(synchronous["orchestrator"][k] for k in GEN)
    t_train = sum(synchronous["trainer"][k] for k in TRAIN)
    bound = (t_gen + t_train) / max(t_gen, t_train)
    achieved = synchronous["step_s"] / asynchronous["step_s"]
    return {"t_gen_s": t_gen, "t_train_s": t_train, "sync_step_s": synchronous["step_s"],
            "async_step_s": asynchronous["step_s"], "bound": bound, "achieved": achieved,
            "fraction_of_bound": achieved / bound}

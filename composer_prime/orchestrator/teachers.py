"""Teacher contexts for hint self-distillation: the student's tokens with a hint inserted.

For an error at turn k the student saw `... previous message <assistant header>` and then
wrote the turn's tokens. The teacher sees the same tokens with one extra message (the hint,
rendered by the chat template) between the previous message and the assistant header, and then
the very same turn tokens. Nothing the model sampled is re-tokenised: the teacher sequence is
a splice of the student's ids and the hint message's ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from composer_prime.contract.distill import Teacher
from composer_prime.env_runtime.turns import Turn, tool_message
from composer_prime.utils.chat import TemplateError, suffix_ids

if TYPE_CHECKING:  # a config check loads the distill step, which imports this: no transformers
    from transformers import PreTrainedTokenizerBase


def history_before(opening: list[dict], turns: list[Turn], k: int) -> list[dict]:
    """The chat messages turn k was generated after: the task's opening plus each earlier turn
    and its tool reply."""
    out = list(opening)
    for t in turns[:k]:
        out.append({"role": "assistant", "content": t.text})
        if t.result is not None:
            out.append(tool_message(t.result))
    return out


def teacher_view(tok: PreTrainedTokenizerBase, student_ids: list[int], turn_start: int, turn_end: int,
                 history: list[dict], hint: str, role: str = "user") -> Teacher:
    """The teacher's view of the turn at student positions [turn_start, turn_end). An empty hint
    gives the student's own context (the teacher is then the student: zero divergence)."""
    render = lambda msgs, **kw: tok.apply_chat_template(msgs, tokenize=False, **kw)  # noqa: E731
    before, why = render(history), "splicing a hint"
    header = suffix_ids(tok, before, render(history, add_generation_prompt=True), why)
    cut = turn_start - len(header)
    if cut < 0 or student_ids[cut:turn_start] != header:
        raise TemplateError("the error turn does not follow the template's assistant header")
    inserted = suffix_ids(tok, before, render(history + [{"role": role, "content": hint}]), why) if hint else []
    ids = student_ids[:cut] + inserted + student_ids[cut:turn_end]
    return Teacher(input_ids=ids, start=turn_start + len(inserted), student_start=turn_start, length=turn_end - turn_start)

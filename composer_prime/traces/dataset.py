"""`composer-prime traces dataset PAIRS --model M --out DIR`: pairs to a DPO dataset, normalised,
with the frozen reference policy's log-probs.

Normalising drops, and counts by reason:
- `empty`: a side with neither text nor a call;
- `identical`: the two sides render the same;
- `duplicate`: the same prompt, chosen and rejected as an earlier pair;
- `circular`: with `--exclude-circular`, a pair flagged as circular;
- `template`: the student's chat template cannot render the pair;
- `too_long`: the prompt and the longer side exceed `--seq-len` tokens.

The seed design chose data-juicer for this step. It is not used. `py-data-juicer` 1.6.1 does
resolve with this project's pins: `uv pip compile` found 91 packages, streamlit among them. But
its filters and deduplicators read one text field per sample. The checks here are on message
lists with tool calls, against the student's own chat template. They would be custom operators
in data-juicer too, so the few rules above are written here, and the output is a Hugging Face
`datasets` dataset.

Each row is in TRL's conversational preference format: `prompt`, `chosen` and `rejected` are
message lists, tool calls rendered as the `<tool_call>{...}</tool_call>` text the environments
parse. Each row also has `ref_chosen_logps` and `ref_rejected_logps`: the reference's log-prob of
each side, summed over its response tokens. TRL's DPOTrainer reads these columns instead of
running a reference model. Our `dpo` channel ships them with each pair. `render` is the one
function that turns a pair into token ids, for this reference pass and for training alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from composer_prime.env_runtime.tool_calls import parse_tool_call
from composer_prime.traces.record import read_jsonl
from composer_prime.utils.fs import check_writable_dir
from composer_prime.utils.chat import TemplateError, suffix_ids

if TYPE_CHECKING:  # the replay step imports `render` from here at every config check: no transformers then
    from transformers import PreTrainedTokenizerBase


def as_text(msg: dict) -> dict:
    """A message with its tool calls written into the text, the way the environments read them."""
    content = ((msg.get("content") or "") if isinstance(msg.get("content"), (str, type(None))) else
               " ".join(p.get("text", "") for p in msg["content"] if isinstance(p, dict)))
    # a recorded rollout's text already holds the call it parsed into `tool_calls`: write it once
    calls = "" if parse_tool_call(content) is not None else "".join(
        f'<tool_call>{json.dumps({"name": c["function"]["name"], "arguments": _args(c)})}</tool_call>' for c in msg.get("tool_calls") or [])
    text = "\n".join(x for x in (content, calls) if x)
    return {"role": msg["role"], "content": text}


def _args(call: dict) -> object:
    try:
        return json.loads(call["function"].get("arguments") or "{}")
    except ValueError:
        return call["function"].get("arguments")


def render(tok: PreTrainedTokenizerBase, prompt: list[dict], reply: dict) -> tuple[list[int], int]:
    """(token ids of prompt + reply, where the reply starts). TemplateError if the template cannot."""
    before = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    after = tok.apply_chat_template(prompt + [reply], tokenize=False)
    ids = tok.encode(before, add_special_tokens=False)
    return ids + suffix_ids(tok, before, after, "a preference pair"), len(ids)


def normalise(pairs: list[dict], tok: PreTrainedTokenizerBase, seq_len: int, exclude_circular: bool) -> tuple[list[dict], Counter]:
    kept, counts, seen = [], Counter(), set()
    for p in pairs:
        prompt = [as_text(m) for m in p["prompt"]]
        chosen, rejected = as_text(p["chosen"][0]), as_text(p["rejected"][0])
        reason = None
        if not chosen["content"].strip() or not rejected["content"].strip():
            reason = "empty"
        elif chosen["content"] == rejected["content"]:
            reason = "identical"
        elif exclude_circular and p.get("circular"):
            reason = "circular"
        digest = hashlib.sha256(json.dumps([prompt, chosen, rejected], sort_keys=True).encode()).hexdigest()
        if reason is None and digest in seen:
            reason = "duplicate"
        if reason is None:
            try:
                longest = max(len(render(tok, prompt, chosen)[0]), len(render(tok, prompt, rejected)[0]))
                reason = "too_long" if longest > seq_len else None
            except (TemplateError, ValueError, KeyError):
                reason = "template"
        if reason is not None:
            counts[reason] += 1
            continue
        seen.add(digest)
        kept.append({"id": p["id"], "prompt": prompt, "chosen": [chosen], "rejected": [rejected],
                     "agree": p.get("agree", []), "circular": bool(p.get("circular"))})
    return kept, counts


def pair_logps(model, tok: PreTrainedTokenizerBase, row: dict) -> dict:
    """{"chosen": log pi(y_w), "rejected": log pi(y_l)}: each reply's log-prob summed over its tokens
    (tensors, with grad unless the caller turned it off)."""
    import torch

    from composer_prime.model.logprobs import token_logprobs

    out = {}
    for side in ("chosen", "rejected"):
        ids, start = render(tok, row["prompt"], row[side][0])
        x = torch.tensor([ids])
        out[side] = token_logprobs(model(input_ids=x).logits[:, :-1], x[:, 1:])[0, start - 1:].sum()
    return out


def reference_logps(rows: list[dict], model_dir: str, tok: PreTrainedTokenizerBase) -> None:
    """Fill ref_chosen_logps / ref_rejected_logps with the frozen model's summed response log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for r in rows:
            for side, lp in pair_logps(model, tok, r).items():
                r[f"ref_{side}_logps"] = float(lp)


def check_out(out: Path) -> None:
    """Before any work: `--out` must be a directory this process can write: new, empty, or an
    earlier run's dataset (replaced). ValueError in one line otherwise."""
    try:
        check_writable_dir(out)
    except OSError as e:
        raise ValueError(f"--out: {e}") from None
    if out.is_dir() and any(out.iterdir()) and not (out / "dataset_info.json").is_file():
        raise ValueError(f"--out {out} holds something other than a dataset; name a new directory")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from composer_prime.model.resolve import resolve_model

    out = Path(args.out)
    try:
        pairs = read_jsonl(Path(args.pairs))
        check_out(out)
        model_dir = resolve_model(args.model)
        tok = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows, dropped = normalise(pairs, tok, args.seq_len, args.exclude_circular)
    if not rows:
        print(f"error: no pair left after normalising {len(pairs)} ({dict(dropped)})", file=sys.stderr)
        return 2
    reference_logps(rows, model_dir, tok)
    from datasets import Dataset

    tmp = out.with_name(f".{out.name}.partial")  # written beside, then renamed: never half a dataset at --out
    shutil.rmtree(tmp, ignore_errors=True)
    Dataset.from_list(rows).save_to_disk(str(tmp))
    shutil.rmtree(out, ignore_errors=True)  # empty, or an earlier run's dataset (check_out)
    tmp.rename(out)
    print(f"{len(rows)} of {len(pairs)} pairs kept -> {args.out}" + (f" (dropped: {dict(sorted(dropped.items()))})" if dropped else ""))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("dataset", help="pairs to a normalised DPO dataset with the reference's log-probs (TRL's format)")
    p.add_argument("pairs", help="pairs.jsonl from `traces replay`")
    p.add_argument("--model", required=True, help="the student: 'tiny', 'smollm2-135m' or a directory (its tokenizer and reference)")
    p.add_argument("--out", required=True, help="dataset directory (datasets.load_from_disk reads it)")
    p.add_argument("--seq-len", type=int, default=1024, help="longest prompt + reply in tokens")
    p.add_argument("--exclude-circular", action="store_true", help="drop pairs whose agreeing teachers include the agent's family")
    p.set_defaults(func=run)
    return p

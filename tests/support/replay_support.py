"""Preference pairs the tests can learn from: reverse-text prompts, the right reversal chosen over
the letters left in order, made into a dataset by the real `composer-prime traces dataset`."""

import json
import sys
from pathlib import Path

from composer_prime.env_runtime.tasksets import load_tasks, messages
from tests.conftest import ROOT
from tests.support import forkserver


def reverse_text_dataset(out: Path, n: int = 200, seed: int = 7) -> Path:
    pairs = [{"id": f"rt-{i}", "prompt": messages(t), "chosen": [{"role": "assistant", "content": t.data.answer}],
              "rejected": [{"role": "assistant", "content": t.data.prompt}], "agree": ["a", "b"], "circular": False}
             for i, t in enumerate(load_tasks("reverse-text", {"num_tasks": n, "seed": seed})) if t.data.answer != t.data.prompt]
    out.mkdir(parents=True, exist_ok=True)
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    made = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "traces", "dataset", str(out / "pairs.jsonl"),
                           "--model", "tiny", "--out", str(out / "dataset"), "--seq-len", "128"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    return out / "dataset"

"""`uv run sft @ sft.toml` (or `--data examples.jsonl ...`): supervised fine-tuning, one process.

The config, the model, the data file and the output directory are checked before torch is
imported: a run must not train for an hour and then fail to write its result.
"""

from __future__ import annotations

import sys

from composer_prime.config import SFTConfig, load_or_exit
from composer_prime.config.loader import one_line_errors
from composer_prime.entrypoints import checks
from composer_prime.utils.logs import setup
from composer_prime.utils.proc import run_main


def main(argv: list[str] | None = None) -> None:
    setup("sft")
    cfg, dry_run = load_or_exit(SFTConfig, sys.argv[1:] if argv is None else argv, checks.SFT)
    if dry_run:
        return
    from composer_prime.trainer.sft import train

    with one_line_errors():  # a malformed example is found once the tokenizer is loaded
        train(cfg)


if __name__ == "__main__":
    run_main(main)

"""`composer-prime env validate ENV_ID_OR_PATH`: model-free gold and no-op checks (like `vf-validate`)."""

from __future__ import annotations

import argparse
import asyncio

from composer_prime.hub.errors import REFUSED, ToolError, one_line_errors


@one_line_errors
def run(args: argparse.Namespace) -> int:
    from composer_prime.env_runtime.calls import CallBox, code_of
    from composer_prime.hub.loading import load_env, taskset_args
    from composer_prime.hub.validate import check_task, summary, table

    if args.call_timeout <= 0:
        raise ToolError("--call-timeout must be more than 0 seconds")
    env, tasks = load_env(args.env, taskset_args(args.args), args.num_tasks or None)
    box = CallBox(env, args.call_timeout, code_of(tasks))

    async def check_all() -> list:
        return [await check_task(i, t, args.gold_min, box) for i, t in enumerate(tasks)]

    checks = asyncio.run(check_all())
    print(table(checks))
    ok, line = summary(env, checks)
    print(line)
    return 0 if ok else REFUSED


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("validate", help="model-free checks: gold answer scores high, an empty reply low")
    p.add_argument("env", help="installed environment id (reverse-text, owner/name@version) or package directory")
    p.add_argument("-n", "--num-tasks", type=int, default=20, help="check the first N tasks (0 = all; default 20)")
    p.add_argument("--args", help='taskset config as JSON, e.g. \'{"split": "eval"}\'')
    p.add_argument("--gold-min", type=float, default=1.0, help="reward the gold answer must reach (default 1.0)")
    p.add_argument("--call-timeout", type=float, default=60.0, metavar="S",
                   help="seconds a call into the environment (a scoring, validate()) may take before it is "
                        "called hung (default 60)")
    p.set_defaults(func=run)
    return p

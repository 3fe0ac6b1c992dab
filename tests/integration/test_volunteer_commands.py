"""The operator's volunteer commands as the docs write them, against a real pool (issue 46): the real pool and
validator in this event loop, a real trusted inference server, two real workers, each with its invite
(`composer-prime volunteers invite`, through the CLI's parser):

- the run's line names a volunteer by its invite, not only its node id;
- `volunteers revoke` says what it revoked and which keys the running pool ejected;
- the revoked worker stops saying why in words (it printed `{"detail": ...}` as it came);
- `volunteers list --run` lists both, one revoked and why;
- the pool stopping with the other worker's lease long-poll still open logs no CancelledError traceback
  (ten lines of it ended every successful volunteers run).

The commands README and docs/volunteers.md write parse as written: tests/unit/volunteer/test_volunteer_cli.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from composer_prime.contract.weights import Directory
from composer_prime.entrypoints.cli import parser
from composer_prime.volunteer.roster import NAME as ROSTER, read_roster
from composer_prime.volunteer.worker import Ejected, Worker
from tests.support import volunteers as V
from tests.support.trusted_server import trusted  # noqa: F401 - a fixture


def command(capfd, errs: list[str], *argv: str) -> str:
    """`composer-prime volunteers ARGV` through the CLI's own parser and command (its main would also set up
    this process's logging, which the test reads); what it printed; stderr so far kept in `errs`."""
    args = parser().parse_args(["volunteers", *argv])
    code = args.func(args)
    out = capfd.readouterr()
    errs.append(out.err)
    assert code == 0, out.err
    return out.out.strip()


def test_invite_revoke_and_list_as_written_and_a_quiet_end(trusted, tmp_path, capfd, caplog):  # noqa: F811
    url, root = trusted
    run = tmp_path / "run"
    tokens = {name: tmp_path / f"{name}.token" for name in ("my-laptop", "other")}
    errs: list[str] = []

    async def go():
        async with V.pool_run(url, "tiny", run, open=False, join_token=None) as (client, pool):
            pool.weights = Directory(str(root))
            for name, path in tokens.items():
                assert command(capfd, errs, "invite", name, "--run", str(run), "--out", str(path)) == str(path)
            workers = {name: V.make_worker(Worker, pool, tmp_path, name, token=None, token_file=path)
                       for name, path in tokens.items()}
            tasks = {}
            for name, w in workers.items():  # one after the other: two models loading at once in threads race
                tasks[name] = asyncio.create_task(w.run())
                while w.engine is None or w.engine._thread is None:
                    assert not tasks[name].done(), tasks[name].result()
                    await asyncio.sleep(0.05)
            while len((read_roster(run / "orchestrator" / ROSTER) or {"members": []})["members"]) < 2:
                await asyncio.sleep(0.1)  # both keys in the roster the pool writes every beat (0.5 s here)
            said = await asyncio.to_thread(command, capfd, errs, "revoke", "my-laptop", "--run", str(run))
            with pytest.raises(Ejected) as ejected:
                await asyncio.wait_for(tasks["my-laptop"], 30)
            listed = command(capfd, errs, "list", "--run", str(run))
            await asyncio.sleep(1.0)
        # as the orchestrator's loop ends right after the pool stops: the other worker's long-polls for a lease
        # (wait_s 5 s, one after another) are still open, and the loop's end cancels them
        tasks["other"].cancel()
        return workers, said, str(ejected.value), listed

    with caplog.at_level(logging.INFO, logger="composer_prime.volunteer"):
        workers, said, why, listed = asyncio.run(go())
    node = workers["my-laptop"].node[:12]
    assert f"volunteer my-laptop ({node}) joined" in caplog.messages
    assert said == f"revoked my-laptop (revoked by the operator): 1 key ejected from the running pool ({node})"
    assert why == "ejected by the run: its invite was revoked: revoked by the operator"
    assert [line.split("\t")[::2] for line in listed.splitlines()] == [["my-laptop", "revoked: revoked by the operator"],
                                                                       ["other", "active"]]
    err = "".join(errs) + capfd.readouterr().err
    assert "Exception in ASGI application" not in err and "CancelledError" not in err, err[-3000:]

"""The operator's volunteer commands as written (issue 46): every `composer-prime volunteers ...` command README and
docs/volunteers.md write parses with the CLI's own parser (README's `volunteers list` had no `--run`, which the
command requires); `revoke` says what it revoked and what became of its keys, read from the pool's roster; a
pool's refusal reaches the worker's line as its reason in words, not as FastAPI's JSON. With a running pool:
tests/integration/test_volunteer_commands.py."""

import json
import re
import shlex
import threading
import time

import pytest

from composer_prime.entrypoints.cli import parser
from composer_prime.volunteer.invites import Invites, store_path
from composer_prime.volunteer.roster import NAME, write_roster
from composer_prime.volunteer.worker import ejected, refusal
from tests.conftest import ROOT

DOCS = ("README.md", "docs/volunteers.md")


def written() -> list[str]:
    """Each volunteers command the docs write, in backticks or a code block, its optional parts ([...]) left out."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        found += re.findall(r"`((?:uv run )?composer-prime volunteers [^`]*)`", text)
        found += re.findall(r"^(uv run composer-prime volunteers .*)$", text, re.M)
    return [re.sub(r"\[[^\]]*\]", "", " ".join(c.split())) for c in found]


def test_every_volunteers_command_the_docs_write_parses_as_written():
    commands = written()
    assert {c.split()[c.split().index("volunteers") + 1] for c in commands} == {"invite", "list", "revoke"}
    for command in commands:
        argv = shlex.split(command)
        try:
            args = parser().parse_args(argv[argv.index("composer-prime") + 1:])
        except SystemExit:
            pytest.fail(f"as the docs write it, it fails: {command}")
        assert args.volunteers_command in ("invite", "list", "revoke")


def revoke(run, capsys, name: str = "my-laptop") -> str:
    args = parser().parse_args(["volunteers", "revoke", name, "--run", str(run)])
    code = args.func(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.strip()


class Member:
    def __init__(self, node: str, invite: str, status: str) -> None:
        self.node_id, self.invite, self.status = node, invite, status


def test_revoke_says_what_it_revoked_and_what_became_of_its_keys(tmp_path, capsys):
    for name in ("my-laptop", "other", "idle"):
        Invites(store_path(tmp_path)).invite(name)
    assert revoke(tmp_path, capsys) == (f"revoked my-laptop (revoked by the operator): no pool is running in {tmp_path}; "
                                        "its keys are refused when they join")
    roster = store_path(tmp_path).with_name(NAME)
    keys = [Member("a" * 64, "other", "healthy"), Member("b" * 64, "other", "dead"), Member("c" * 64, "idle", "ejected")]
    write_roster(roster, keys, heartbeat_s=0.05)  # a running pool's roster, rewritten every beat
    ejecting = threading.Timer(0.3, write_roster, (roster, [Member(k.node_id, k.invite, "ejected") for k in keys], 0.05))
    ejecting.start()  # the pool ejects other's two keys a few beats after the revocation (as pool._watch does)
    assert revoke(tmp_path, capsys, "other") == ("revoked other (revoked by the operator): 2 keys ejected from the running "
                                                 "pool (aaaaaaaaaaaa, bbbbbbbbbbbb)")
    ejecting.join()
    data = json.loads(roster.read_text())
    data["members"] = data["members"][:2]  # idle's key long gone
    roster.write_text(json.dumps(data))
    assert revoke(tmp_path, capsys, "idle") == "revoked idle (revoked by the operator): no key of it is in the running pool"
    data["time"] = time.time() - 60  # a roster no pool has written for a minute: none is running
    roster.write_text(json.dumps(data))
    Invites(store_path(tmp_path)).invite("late")
    assert revoke(tmp_path, capsys, "late").endswith(f"no pool is running in {tmp_path}; its keys are refused when they join")


def test_a_refusal_reaches_the_worker_as_its_reason_in_words():
    said = '{"detail":"this node was ejected from the run: its invite was revoked: revoked by the operator"}'
    assert str(ejected(refusal(said))) == "ejected by the run: its invite was revoked: revoked by the operator"
    assert refusal('{"detail":"more than 2 requests/s"}') == "more than 2 requests/s"
    assert refusal("Internal Server Error") == "Internal Server Error"  # not JSON: as it came
    assert refusal('{"detail":[{"loc":["body"]}]}') == '{"detail":[{"loc":["body"]}]}'  # not words: as it came

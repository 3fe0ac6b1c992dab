"""Many sources into one task set (feature_deletion.sources): a list file, parallel builds,
resume after a crash without redoing finished sources, one index whose tasks load together; and
what a project declares it needs (feature_deletion.requirements)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from feature_deletion.baseline import BuildError
from feature_deletion.hostguard import tree_digest
from feature_deletion.requirements import declared
from feature_deletion.scoring import score_task
from feature_deletion.sources import build_many, parse_sources
from sandbox_support import DEPLIB, SRCLIB, write_tree

quiet = lambda m: None  # noqa: E731


def test_list_build_resumes_and_indexes(tmp_path, capsys):
    from composer_prime.entrypoints.cli import main

    listing = write_tree(tmp_path, {"list.txt": f"# two fixtures\n{SRCLIB}\n\n{DEPLIB}  six   # one more requirement\n"})
    out = tmp_path / "many"
    with pytest.raises(SystemExit) as e:
        main(["env", "build-tasks", "feature-deletion", "--sources", str(listing / "list.txt"), "--out", str(out),
              "--max-tasks", "1", "--jobs", "2"])
    printed = capsys.readouterr()
    assert e.value.code == 0 and printed.out.strip().splitlines()[-1] == str(out)
    assert "] build-tasks: 2/2 sources (100%)" in printed.err.splitlines()[-1]  # the last progress line
    index = json.loads((out / "manifest.json").read_text())
    assert [(s["slug"], s["status"], s["accepted"]) for s in index["sources"]] == [("srclib", "ok", 1), ("deplib", "ok", 1)]
    assert [t["id"].split("/")[0] for t in index["tasks"]] == ["srclib", "deplib"]
    assert "six" in json.loads((out / "sources" / "deplib" / "manifest.json").read_text())["testenv"]["requirements"]
    assert (out / "sources" / "srclib.build.log").is_file()

    # Tasks of both sources load as one task set, each scored against its own test environment.
    from feature_deletion.taskset import FeatureDeletionConfig, FeatureDeletionTaskset

    tasks = list(FeatureDeletionTaskset(FeatureDeletionConfig(taskset_dir=str(out))))
    assert [t.data.id for t in tasks] == [t["id"] for t in index["tasks"]]
    for t in tasks:
        d = Path(t.data.task_dir)
        fixed = tmp_path / "fixed" / d.name
        shutil.copytree(d / "repo", fixed)
        shutil.copytree(d / "solution", fixed, dirs_exist_ok=True)
        assert score_task(d, fixed).reward == 1.0

    # A crash in the middle of deplib's build: its set is gone, a staging directory is left.
    srclib_before = tree_digest(out / "sources" / "srclib")
    shutil.rmtree(out / "sources" / "deplib")
    (out / "sources" / ".deplib.partial-999").mkdir()
    lines: list[str] = []
    again = build_many(parse_sources(listing / "list.txt"), out, max_tasks=1, jobs=2, log=lines.append)
    assert lines[0] == "2 sources: 1 already finished, 1 to build"
    assert tree_digest(out / "sources" / "srclib") == srclib_before  # never built again
    assert not (out / "sources" / ".deplib.partial-999").exists()
    assert [t["id"] for t in again["tasks"]] == [t["id"] for t in index["tasks"]]
    with pytest.raises(BuildError, match="built with other settings .max_tasks differ"):
        build_many(parse_sources(listing / "list.txt"), out, max_tasks=2, log=quiet)


def test_a_failing_source_is_recorded_and_the_others_kept(tmp_path):
    bad = write_tree(tmp_path / "bad", {"pkg/__init__.py": "def f(x):\n    return x\n",
                                        "tests/test_pkg.py": "from pkg import f\n\ndef test_f():\n    assert f(1) == 1\n"})
    listing = write_tree(tmp_path, {"list.txt": f"{bad}\n{SRCLIB}\n"})
    index = build_many(parse_sources(listing / "list.txt"), tmp_path / "out", max_tasks=1, jobs=1, log=quiet)
    status = {s["slug"]: s for s in index["sources"]}
    assert status["srclib"]["status"] == "ok" and status["bad"]["status"] == "failed"
    assert status["bad"]["error"].startswith("no task accepted from")
    assert [t["id"].split("/")[0] for t in index["tasks"]] == ["srclib"]


@pytest.mark.parametrize("text, message", [
    ("pypi:inflection\n", "list.txt:1: a pypi source pins one version"),
    ("pypi:a==1\n./nope\n", "list.txt:2: source not found: ./nope"),
    ("pypi:a==1\npypi:a==1\n", "list.txt:2: pypi:a==1 repeats the source of line 1"),
    ("# nothing\n", "lists no sources"),
])
def test_bad_source_lists_name_the_line(tmp_path, text, message):
    write_tree(tmp_path, {"list.txt": text})
    with pytest.raises(BuildError, match=message.replace(".", r"\.")):
        parse_sources(tmp_path / "list.txt")


def test_declared_requirements_from_every_place(tmp_path):
    root = write_tree(tmp_path / "proj", {
        "PKG-INFO": ("Metadata-Version: 2.1\nName: Proj\nVersion: 1.0\nRequires-Dist: attrs>=22\n"
                     "Requires-Dist: tomli; python_version < '3.11'\nProvides-Extra: test\n"
                     "Requires-Dist: hypothesis>=6; extra == 'test'\nRequires-Dist: proj[yaml]; extra == 'test'\n"
                     "Provides-Extra: yaml\nRequires-Dist: pyyaml; extra == 'yaml'\n"
                     "Provides-Extra: docs\nRequires-Dist: furo; extra == 'docs'\n"),
        "setup.cfg": "[options]\ntests_require =\n    freezegun\n",
        "requirements-dev.txt": "-r requirements/test.txt\nblack==22.1\nsimplejson==3.0.0  # pinned\n-e .\n",
        "requirements/test.txt": "pytz>=2020\n",
        "docs/requirements.txt": "sphinx\n",
        "tox.ini": "[testenv]\ndeps =\n    pytest\n    py311: mock\n    {[base]deps}\n",
    })
    d = declared(root)
    assert d.names == {"proj"}
    assert d.runtime == ["attrs>=22"]  # tomli: not for this Python
    # Test extras (and the project's own extra they name), requirement files named for tests (as
    # names: pins go stale), tox deps; no tooling, no docs, no dev file while a test file exists.
    assert d.test == ["hypothesis>=6", "pyyaml", "freezegun", "pytz", "pytest", "mock"]
    (root / "requirements" / "test.txt").unlink()
    assert declared(root).test == ["hypothesis>=6", "pyyaml", "freezegun", "simplejson", "pytest", "mock"]

"""Hub tooling against the local stand-in hub, with the REAL `prime` CLI (0.18.0) as the reference:
`prime env push/pull/install/version list` and our `publish`/`install`/`build` talk to the same
stand-in on 127.0.0.1. HOME is a temp dir, so no ~/.prime/config.json of the machine is read."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from composer_prime.hub.files import collect_files, content_hash
from composer_prime.hub.scaffold import scaffold
from tests.conftest import ROOT, free_port, start_until_ready
from tests.support import forkserver

KEY = "stand-in-test-key"
PRIME = Path(sys.executable).parent / "prime"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    data = tmp_path_factory.mktemp("hub-data")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_until_ready([sys.executable, "-m", "tests.support.hub_standin", "--port", str(port),
                              "--data", str(data), "--api-key", KEY], lambda: httpx.get(f"{url}/_standin/health").json()["standin"],
                             timeout_s=60)
    yield SimpleNamespace(url=url, data=data, home=tmp_path_factory.mktemp("home"))
    proc.terminate()
    proc.wait(timeout=10)


def _env(hub, key: str | None, base: str | None = None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PRIME_") and k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    env |= {"HOME": str(hub.home), "PRIME_BASE_URL": base or hub.url, "PRIME_DISABLE_VERSION_CHECK": "1",
            "COLUMNS": "400"} | extra
    return env | ({"PRIME_API_KEY": key} if key else {})


def prime(hub, *args: str, cwd: Path, key: str | None = KEY, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PRIME), *args], cwd=cwd, env=_env(hub, key, **extra), capture_output=True, text=True)


def ours(hub, *args: str, key: str | None = KEY, base: str | None = None) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "env", *args], cwd=ROOT,
                          env=_env(hub, key, base), capture_output=True, text=True)


def details(hub, ref: str) -> httpx.Response:
    owner, rest = ref.split("/")
    name, version = rest.split("@")
    return httpx.get(f"{hub.url}/api/v1/environmentshub/{owner}/{name}/@{version}")


def assert_one_line_error(r: subprocess.CompletedProcess, code: int, needle: str) -> None:
    err = r.stderr.strip()
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err and needle in err, err


def test_file_rules_and_hash_equal_prime(tmp_path):
    from prime_cli.commands.env import _collect_archive_files, compute_content_hash

    t = tmp_path / "awkward"
    files = {"README.md": "r", "pyproject.toml": "[project]", "main.py": "x", "LICENSE": "l", ".env": "h",
             "pkg/__init__.py": "p", "pkg/sub/m.py": "q", "pkg/__pycache__/m.pyc": "c", "pkg/.secret": "s",
             "pkg/a.txt": "a", "pkg/c.txt": "c", "pkg/deep/outputs/o": "o", "pkg/foo/x/bar/f": "f",
             "dist/x.whl": "d", "build/y": "b", "data/build/f": "e", "data/a.csv": "1", "data/b.log": "2",
             "data/keep.log": "3", "logs/x.txt": "i", "x.egg-info/PKG-INFO": "e", ".hidden/z.py": "z",
             "tmp/t.py": "t", "pkg/tmp/t.py": "t", "space /f.py": "sp",
             ".gitignore": "\n".join(["*.log", "!data/keep.log", "logs/", "/data/*.csv", "# comment", "",
                                       "**/tmp", "foo/**/bar", "[ab].txt", "space\\ ", ""])}
    for rel, text in files.items():
        (t / rel).parent.mkdir(parents=True, exist_ok=True)
        (t / rel).write_text(text)
    (t / "pkg" / "link.md").symlink_to(t / "README.md")
    for root in (t, ROOT / "environments" / "reverse-text"):
        root = root.resolve()
        theirs = [p.relative_to(root).as_posix() for p in _collect_archive_files(root)]
        assert [rel for rel, _ in collect_files(root)] == theirs
        assert content_hash(root) == compute_content_hash(root)
    assert [rel for rel, _ in collect_files(t.resolve())] == [
        "README.md", "data/keep.log", "main.py", "pkg/__init__.py", "pkg/c.txt", "pkg/foo/x/bar/f",
        "pkg/sub/m.py", "pyproject.toml"]


def test_missing_or_bad_key_is_401(hub, tmp_path):
    api = f"{hub.url}/api/v1/environmentshub"
    assert httpx.post(f"{api}/resolve", json={"name": "x"}).status_code == 401
    bad = {"Authorization": "Bearer nope"}
    assert httpx.post(f"{api}/resolve", json={"name": "x"}, headers=bad).status_code == 401
    assert httpx.get(f"{api}/", headers=bad).status_code == 401
    assert httpx.get(f"{api}/").status_code == 200  # public reads are anonymous

    root = scaffold("key-probe", tmp_path)
    r = prime(hub, "env", "push", cwd=root, key="nope")
    assert r.returncode == 1 and "API key unauthorized" in r.stdout
    r = prime(hub, "env", "push", cwd=root, key=None)
    assert r.returncode == 1 and "No API key configured" in r.stdout  # prime refuses before asking
    assert_one_line_error(ours(hub, "publish", str(root), "--yes", key=None), 2, "no API key")
    assert_one_line_error(ours(hub, "publish", str(root), "--yes", key="nope"), 1, "401")
    assert details(hub, "local/key-probe@latest").status_code == 404


def test_push_then_identical_repush_refused_then_new_version_accepted(hub, tmp_path):
    root = scaffold("push-probe", tmp_path)
    r = prime(hub, "env", "push", cwd=root)
    assert r.returncode == 0 and "Successfully pushed local/push-probe" in r.stdout, r.stdout
    pushed = details(hub, "local/push-probe@0.1.0").json()["data"]
    assert pushed["content_hash"] == content_hash(root)  # what prime sent == what we compute
    assert pushed["runtime_hint"] == "VERIFIERS_V1"

    r = prime(hub, "env", "push", cwd=root)
    assert r.returncode == 1 and "HTTP 409" in r.stdout and "already exists" in r.stdout
    assert_one_line_error(ours(hub, "publish", str(root), "--yes"), 1, "already exists")

    pyproject = root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.1"'))
    r = ours(hub, "publish", str(root), "--yes")
    assert r.returncode == 0 and "pushed local/push-probe@0.1.1" in r.stdout, r.stderr
    r = prime(hub, "env", "push", cwd=root)  # identical to 0.1.1 now: refused too
    assert r.returncode == 1 and "already exists" in r.stdout

    r = prime(hub, "env", "version", "list", "local/push-probe", "--full-hashes", cwd=tmp_path)
    assert r.returncode == 0 and "0.1.0" in r.stdout and "Latest version: 0.1.1" in r.stdout
    assert content_hash(root) in r.stdout
    # our upload requests carry what prime's carry
    state = json.loads((hub.data / "state.json").read_text())
    by_version = {v["semantic_version"]: v for v in state["versions"].values()
                  if v["finalized"] and v["filename"].startswith("push-probe-")}
    theirs, mine = by_version["0.1.0"], by_version["0.1.1"]
    assert set(theirs) == set(mine) and set(theirs["metadata"]) == set(mine["metadata"])
    assert mine["filename"] == f"push-probe-0.1.1-{content_hash(root)[:8]}.tar.gz"
    assert mine["metadata"]["requires_dist"] == theirs["metadata"]["requires_dist"] == ["verifiers==0.4.0"]


def test_dry_run_pushes_nothing_and_prime_pulls_what_we_published(hub, tmp_path):
    root = scaffold("pull-probe", tmp_path / "src")
    r = ours(hub, "publish", str(root))
    assert r.returncode == 0 and "dry run: would push <your account>/pull-probe@0.1.0" in r.stdout
    assert details(hub, "local/pull-probe@latest").status_code == 404
    assert ours(hub, "publish", str(root), "--yes").returncode == 0

    r = prime(hub, "env", "pull", "local/pull-probe@0.1.0", "-t", str(tmp_path / "pulled"), cwd=tmp_path, key=None)
    assert r.returncode == 0, r.stdout
    pulled = sorted(p.relative_to(tmp_path / "pulled").as_posix() for p in (tmp_path / "pulled").rglob("*")
                    if p.is_file() and ".prime" not in p.parts)
    assert pulled == [rel for rel, _ in collect_files(root)]
    assert content_hash(tmp_path / "pulled") == content_hash(root)


def test_install_with_ours_and_with_prime(hub, tmp_path):
    root = scaffold("install-probe", tmp_path / "src")
    assert ours(hub, "publish", str(root), "--yes").returncode == 0
    target = tmp_path / "target"
    r = ours(hub, "install", "local/install-probe@0.1.0", "--target", str(target), "--no-deps", key=None)
    assert r.returncode == 0 and "installed local/install-probe@0.1.0" in r.stdout, r.stderr
    probe = ("import install_probe; from install_probe.taskset import InstallProbeConfig as C; "
             "print(install_probe.__file__); print(len(list(install_probe.InstallProbeTaskset(C(num_tasks=3)))))")
    out = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(target)},
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.split() == [str(target / "install_probe" / "__init__.py"), "3"], out.stderr

    # a dependency-free package, so the throwaway venv needs nothing from a registry
    hello = tmp_path / "hello"
    (hello / "hello_hub").mkdir(parents=True)
    (hello / "hello_hub" / "__init__.py").write_text('GREETING = "hi"\n')
    project = ('[project]\nname = "hello-hub"\nversion = "{}"\nrequires-python = ">=3.11"\ndependencies = []\n'
               '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
               '[tool.hatch.build.targets.wheel]\npackages = ["hello_hub"]\n')
    (hello / "pyproject.toml").write_text(project.format("0.1.0"))
    assert ours(hub, "publish", str(hello), "--yes").returncode == 0
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", str(venv)], check=True)
    r = prime(hub, "env", "install", "local/hello-hub@0.1.0", cwd=tmp_path, key=None, VIRTUAL_ENV=str(venv))
    assert r.returncode == 0 and "Successfully installed local/hello-hub@0.1.0" in r.stdout, r.stdout
    version = "import importlib.metadata as m, hello_hub; print(hello_hub.GREETING, m.version('hello-hub'))"

    def venv_reports() -> list[str]:
        return subprocess.run([venv / "bin" / "python", "-c", version], capture_output=True, text=True).stdout.split()
    assert venv_reports() == ["hi", "0.1.0"]

    (hello / "pyproject.toml").write_text(project.format("0.2.0"))
    assert ours(hub, "publish", str(hello), "--yes").returncode == 0
    r = ours(hub, "install", "local/hello-hub@0.2.0", "--python", str(venv / "bin" / "python"), key=None)
    assert r.returncode == 0, r.stderr
    assert venv_reports() == ["hi", "0.2.0"]


def test_install_refuses_a_wheel_whose_hash_does_not_match(hub, tmp_path):
    root = scaffold("tamper-probe", tmp_path / "src")
    assert ours(hub, "publish", str(root), "--yes").returncode == 0
    info = details(hub, "local/tamper-probe@0.1.0").json()["data"]
    blob = hub.data / "blobs" / info["wheel_sha256"]
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == info["wheel_sha256"]
    blob.write_bytes(blob.read_bytes() + b"tampered")
    target = tmp_path / "target"
    assert_one_line_error(ours(hub, "install", "local/tamper-probe@0.1.0", "--target", str(target), "--no-deps"),
                          1, "sha256 mismatch")
    assert not target.exists() or not any(target.iterdir())


def test_bad_input_is_one_line_exit_2(hub, tmp_path):
    assert_one_line_error(ours(hub, "install", "not-a-ref"), 2, "malformed environment id")
    assert_one_line_error(ours(hub, "install", "a/b/c@1"), 2, "malformed environment id")
    assert_one_line_error(ours(hub, "install", "local/nothing-here@1.0"), 2, "not found")
    dead = f"http://127.0.0.1:{free_port()}"
    assert_one_line_error(ours(hub, "install", "local/x@1.0", base=dead), 2, "unreachable")
    root = scaffold("bad-input-probe", tmp_path)
    assert_one_line_error(ours(hub, "publish", str(root), "--yes", base=dead), 2, "unreachable")
    shutil.rmtree(root / "bad_input_probe")
    assert_one_line_error(ours(hub, "build", str(root)), 2, "no Python package")
    assert_one_line_error(ours(hub, "build", str(tmp_path / "missing")), 2, "not a directory")


def test_prime_config_file_is_honoured_like_prime(hub, tmp_path):
    """No PRIME_* variables: the key and server come from ~/.prime/config.json, as for `prime`."""
    home = tmp_path / "home"
    (home / ".prime").mkdir(parents=True)
    (home / ".prime" / "config.json").write_text(json.dumps({"api_key": KEY, "base_url": f"{hub.url}/api/v1"}))
    root = scaffold("config-probe", tmp_path)
    env = {k: v for k, v in _env(hub, None).items() if not k.startswith("PRIME_")} | {"HOME": str(home)}
    r = forkserver.run([sys.executable, "-m", "composer_prime.entrypoints.cli", "env", "publish", str(root), "--yes"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and f"to {hub.url}" in r.stdout, r.stderr
    assert details(hub, "local/config-probe@0.1.0").json()["data"]["content_hash"] == content_hash(root)

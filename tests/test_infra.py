"""infra/ files can't be deployed here (no Docker daemon, Kubernetes or SLURM); these tests check
that every command they run names one of our entrypoints and resolves its config."""

import os
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.conftest import ROOT

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def entry(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    module = SCRIPTS[name].split(":")[0]
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True)


def test_k8s_containers_run_our_entrypoints_on_resolved_configs(tmp_path):
    assert entry("rl", "@", "configs/quickstart.toml", "--output_dir", str(tmp_path), "--dry-run").returncode == 0
    containers = [c for doc in yaml.safe_load_all((ROOT / "infra/k8s/rl.yaml").read_text())
                  if doc["kind"] == "Deployment" for c in doc["spec"]["template"]["spec"]["containers"]]
    assert sorted(c["name"] for c in containers) == ["inference", "orchestrator", "trainer"]
    for c in containers:
        name, *args = c["command"]
        assert name in SCRIPTS, name
        args = [a.replace("/run", str(tmp_path)) for a in args]
        r = entry(name, *args, "--dry-run")
        assert r.returncode == 0, (c["name"], r.stderr)


def test_slurm_script_resolves_and_starts_three_processes(tmp_path):
    """Runs rl.sbatch itself with stand-ins for SLURM's scontrol/srun and for uv: every process
    it starts gets --dry-run, so this proves the overrides and paths it builds are valid."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    launched = tmp_path / "launched.txt"
    shims = {
        "scontrol": "#!/bin/sh\necho \"$3\"\n",  # show hostnames <list>: our lists hold one name
        "srun": f"#!/bin/sh\nshift\necho \"$@\" >> {launched}\nexec \"$@\" --dry-run\n",
        "uv": f"#!/bin/sh\nshift\nname=$1; shift\nexec {sys.executable} -c 'import sys,tomllib; "
              "s=tomllib.load(open(\"pyproject.toml\",\"rb\"))[\"project\"][\"scripts\"][sys.argv[1]]; "
              "m,f=s.split(\":\"); sys.argv=sys.argv[1:]; getattr(__import__(m,fromlist=[f]),f)()' \"$name\" \"$@\"\n",
    }
    for name, text in shims.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "OUTPUT_DIR": str(tmp_path / "run"),
           "SLURM_JOB_NODELIST_HET_GROUP_0": "node0", "SLURM_JOB_NODELIST_HET_GROUP_1": "node1"}
    r = subprocess.run(["bash", str(ROOT / "infra/slurm/rl.sbatch"), "configs/quickstart.toml"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[2] for line in launched.read_text().splitlines()) == ["inference", "orchestrator", "trainer"]
    orch = tomllib.loads((tmp_path / "run/configs/orchestrator.toml").read_text())
    assert orch["inference_urls"] == ["http://node0:8000"] and orch["transport"]["address"] == "tcp://node1:5557"
    assert tomllib.loads((tmp_path / "run/configs/inference.toml").read_text())["host"] == "0.0.0.0"
    assert orch["auth"]["keys_dir"] == str(tmp_path / "run/keys")  # the binds leave loopback: the plan names keys,
    assert (tmp_path / "run/keys/trainer.key_secret").exists()  # and the script makes them


def test_dockerfile_default_command_is_an_entrypoint():
    cmd = next(ln for ln in (ROOT / "infra/docker/Dockerfile").read_text().splitlines() if ln.startswith("CMD"))
    name = yaml.safe_load(cmd[3:])[0]
    assert name in SCRIPTS

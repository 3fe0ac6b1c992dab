"""infra/ files can't be deployed here (no Docker daemon, Kubernetes or SLURM); these tests check
that every command they run names one of our entrypoints and resolves its config, and that the
Kubernetes and SLURM files run the image infra/docker/Dockerfile builds (its install line is
dry-run in tests/integration/test_install.py)."""

import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tests.support import forkserver

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
DOCKERFILE = (ROOT / "infra/docker/Dockerfile").read_text()
IMAGE = re.search(r"docker build -f infra/docker/Dockerfile -t (\S+) \.", DOCKERFILE).group(1)  # the tag it documents


def entry(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The entrypoint `name` as `python -m` runs it (forked from the tests' fork server where it serves that module)."""
    module = SCRIPTS[name].split(":")[0]
    return forkserver.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True)


def test_k8s_containers_run_our_entrypoints_on_resolved_configs(tmp_path):
    assert entry("rl", "@", "configs/quickstart.toml", "--output_dir", str(tmp_path), "--dry-run").returncode == 0
    containers = [c for doc in yaml.safe_load_all((ROOT / "infra/k8s/rl.yaml").read_text())
                  if doc["kind"] == "Deployment" for c in doc["spec"]["template"]["spec"]["containers"]]
    assert sorted(c["name"] for c in containers) == ["inference", "orchestrator", "trainer"]
    assert {c["image"] for c in containers} == {IMAGE}
    for c in containers:
        name, *args = c["command"]
        assert name in SCRIPTS, name
        args = [a.replace("/run", str(tmp_path)) for a in args]
        r = entry(name, *args, "--dry-run")
        assert r.returncode == 0, (c["name"], r.stderr)


def test_slurm_script_resolves_and_starts_three_processes_in_the_image(tmp_path):
    """Runs rl.sbatch itself with stand-ins for SLURM's scontrol and srun: srun records its options,
    then runs the entrypoint it names with --dry-run (the keys command for real), so this proves the overrides and paths it
    builds are valid and that every step runs in the image infra/docker builds."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    launched = tmp_path / "launched.txt"
    run_entry = ("import sys,tomllib; s=tomllib.load(open(\"pyproject.toml\",\"rb\"))[\"project\"][\"scripts\"][sys.argv[1]]; "
                 "m,f=s.split(\":\"); sys.argv=sys.argv[1:]; getattr(__import__(m,fromlist=[f]),f)()")
    shims = {
        "scontrol": "#!/bin/sh\necho \"$3\"\n",  # show hostnames <list>: our lists hold one name
        "srun": "#!/bin/sh\nopts=\nwhile [ \"${1#--}\" != \"$1\" ]; do opts=\"$opts $1\"; shift; done\n"
                f"echo \"$1 $opts\" >> {launched}\nname=$1; shift\n"
                "case \" $* \" in *\" --dry-run \"*) ;; *) [ \"$name\" = composer-prime ] || set -- \"$@\" --dry-run;; esac\n"
                f"exec {sys.executable} -c '{run_entry}' \"$name\" \"$@\"\n",
    }
    for name, text in shims.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(stat.S_IRWXU)
    out = tmp_path / "run"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", "OUTPUT_DIR": str(out),
           "SLURM_JOB_NODELIST_HET_GROUP_0": "node0", "SLURM_JOB_NODELIST_HET_GROUP_1": "node1", "SLURM_JOB_NODELIST_HET_GROUP_2": "node2",
           "IMAGE": IMAGE}  # a GPU cluster's submission; without IMAGE (test_slurm.py) no container
    r = subprocess.run(["bash", str(ROOT / "infra/slurm/rl.sbatch"), "configs/quickstart.toml"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    steps = [line.split() for line in launched.read_text().splitlines()]
    assert sorted(s[0] for s in steps) == ["composer-prime", "inference", "orchestrator", "rl", "trainer"]
    for name, *opts in steps:
        assert f"--container-image={IMAGE}" in opts and f"--container-mounts={out}:{out}" in opts, (name, opts)
    orch = tomllib.loads((out / "configs/orchestrator.toml").read_text())
    assert orch["inference_urls"] == ["http://node0:8000"] and orch["transport"]["address"] == "tcp://node1:5557"
    assert tomllib.loads((out / "configs/inference.toml").read_text())["host"] == "0.0.0.0"
    assert orch["auth"]["keys_dir"] == str(out / "keys")  # the binds leave loopback: the plan names keys,
    assert (out / "keys/trainer.key_secret").exists()  # and the script makes them


def test_dockerfile_default_command_is_an_entrypoint():
    cmd = next(ln for ln in DOCKERFILE.splitlines() if ln.startswith("CMD"))
    name = yaml.safe_load(cmd[3:])[0]
    assert name in SCRIPTS


def test_k8s_islands_run_our_entrypoints_with_each_pods_island(tmp_path):
    """infra/k8s/islands.yaml: the lighthouse and every island pod's rl resolve (Kubernetes fills
    $(ISLAND) from the pod's index and $(POD_IP) from its address: here 0..replicas-1 and loopback)."""
    docs = list(yaml.safe_load_all((ROOT / "infra/k8s/islands.yaml").read_text()))
    [lighthouse] = [c for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]
    [island_set] = [d for d in docs if d["kind"] == "StatefulSet"]
    [island] = island_set["spec"]["template"]["spec"]["containers"]
    assert {lighthouse["image"], island["image"]} == {IMAGE}
    name, *args = lighthouse["command"]
    assert name == "lighthouse" and entry(name, *args, "--dry-run").returncode == 0
    name, *args = island["command"]
    islands = int(args[args.index("--diloco.islands") + 1])
    assert name == "rl" and islands == island_set["spec"]["replicas"]
    for k in range(islands):
        argv = [a.replace("$(ISLAND)", str(k)).replace("$(POD_IP)", "127.0.0.1").replace("/run", str(tmp_path)) for a in args]
        r = entry(name, *argv, "--dry-run")
        assert r.returncode == 0, r.stderr
        assert sorted(p.name for p in (tmp_path / "configs").glob(f"island{k}-*")) == \
            [f"island{k}-{n}.toml" for n in ("inference", "orchestrator", "trainer")]

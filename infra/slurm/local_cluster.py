"""A three-node SLURM on this one machine, for trying the .sbatch files (and the tests that run them).

    python infra/slurm/local_cluster.py start DIR    # prints `export SLURM_CONF=DIR/slurm.conf`
    python infra/slurm/local_cluster.py stop DIR

Writes DIR/slurm.conf (nodes n1..n3, NodeAddr=127.0.0.1, slurmd ports 17001-17003, 8 CPUs and one
declared GPU each: no device behind it, so `--gpus-per-node=1` schedules here and a GPU cluster's
script runs unchanged), a munge key, and starts munged (its own socket in DIR), slurmctld and three
slurmd as root, every file and pid in DIR. The node names must resolve: start adds
`127.0.0.1 n1 n2 n3` to /etc/hosts (stop removes that line). Needs Debian's `slurm-wlm` and `munge`
(SLURM 22.05) and root.
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("n1", "n2", "n3")
HOSTS_LINE = "127.0.0.1 " + " ".join(NODES) + "  # composer-prime local SLURM"
CTLD_PORT = 16817


def conf(d: Path) -> str:
    host = socket.gethostname().split(".")[0]
    return f"""ClusterName=local
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={CTLD_PORT}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
MinJobAge=600
SchedulerParameters=bf_interval=1,sched_interval=1
GresTypes=gpu
NodeName=n[1-3] NodeHostname={host} NodeAddr=127.0.0.1 Port=17001-17003 CPUs=8 Gres=gpu:1 State=UNKNOWN
PartitionName=local Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP
"""


def env(d: Path) -> dict:
    return {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}


def _hosts(add: bool) -> None:
    hosts = Path("/etc/hosts")
    lines = [ln for ln in hosts.read_text().splitlines() if ln != HOSTS_LINE]
    hosts.write_text("\n".join(lines + ([HOSTS_LINE] if add else [])) + "\n")


def start(d: Path, timeout_s: float = 60) -> dict:
    """Start the cluster in `d`; returns the environment that talks to it (SLURM_CONF set)."""
    d = Path(d).resolve()
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    for sub in ("state", *(f"spool/{n}" for n in NODES)):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "slurm.conf").write_text(conf(d))
    (d / "gres.conf").write_text("NodeName=n[1-3] Name=gpu File=/dev/null\n")
    key = d / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _hosts(True)
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={d}/munge.socket",
                    f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"], check=True)
    e = env(d)
    subprocess.run(["slurmctld", "-c"], env=e, check=True)
    for n in NODES:
        subprocess.run(["slurmd", "-c", "-N", n], env=e, check=True)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=e, capture_output=True, text=True)
        states = dict(ln.split() for ln in r.stdout.splitlines())
        if r.returncode == 0 and len(states) == 3 and all(s in ("idle", "mix", "alloc") for s in states.values()):
            return e
        time.sleep(0.5)
    logs = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(d.glob("*.log")))
    stop(d)
    raise RuntimeError(f"the local SLURM did not come up in {timeout_s:.0f}s: sinfo says {r.stdout or r.stderr}\n{logs}")


def stop(d: Path) -> None:
    """Stop the daemons `start` began in `d`, by the pids they wrote."""
    d = Path(d).resolve()
    pids = [d / f"slurmd-{n}.pid" for n in NODES] + [d / "slurmctld.pid", d / "munged.pid"]
    for pidfile in pids:
        if not pidfile.exists():
            continue
        try:
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, 15)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
        except (ProcessLookupError, ValueError, IndexError):
            pass
        pidfile.unlink(missing_ok=True)
    _hosts(False)


if __name__ == "__main__":
    cmd, d = sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/composer-prime-slurm")
    if cmd == "start":
        start(d)
        print(f"export SLURM_CONF={d.resolve()}/slurm.conf")
    elif cmd == "stop":
        stop(d)
    else:
        sys.exit("usage: local_cluster.py start|stop [DIR]")

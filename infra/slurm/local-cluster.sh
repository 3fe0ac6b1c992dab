#!/usr/bin/env bash
# A three-node SLURM on this machine (n1..n3 on 127.0.0.1, one slurmctld, three slurmd, munged), as root:
#   apt-get install -y slurm-wlm munge
#   eval "$(infra/slurm/local-cluster.sh start)"      # sets SLURM_CONF; state in ${SLURM_DIR:-/tmp/composer-prime-slurm}
#   OUTPUT_DIR=$PWD/runs/slurm PATH=$PWD/.venv/bin:$PATH sbatch infra/slurm/rl.sbatch configs/quickstart.toml --max_steps 3
#   infra/slurm/local-cluster.sh stop
# infra/slurm/local_cluster.py does the work (the test suite's fixture calls it too).
set -euo pipefail
exec python3 "$(dirname "$0")/local_cluster.py" "${1:?usage: local-cluster.sh start|stop}" "${SLURM_DIR:-/tmp/composer-prime-slurm}"

#!/usr/bin/env bash
# One `prism launch` per node of a SLURM allocation, as torchrun runs one agent per host: a capture or an
# emulation spread over the allocation's nodes (`prism.runtime.launch.hosts`). The arguments are those of one
# host's `prism launch` without --nnodes/--node-rank/--master-addr/--master-port, which come from SLURM:
#   sbatch -N 2 --ntasks-per-node=1 scripts/slurm_launch.sh --nproc 4 --devices 1 --mode capture --out JOB PROGRAM...
#   salloc -N 2 --ntasks-per-node=1 scripts/slurm_launch.sh --nproc 4 --mode emulate --capture JOB --sandbox 2,6 \
#       --out EMU PROGRAM...
# Host 0 is the allocation's first node: its NodeAddr (`scontrol show node`) serves the rendezvous on port
# PRISM_MASTER_PORT (default 29500). JOB must be on a file system every node sees. PRISM_PYTHON: the python
# whose prism runs (default python3). Each node's launcher prints its own lines; srun prefixes nothing.
set -euo pipefail
if [[ -z "${SLURM_JOB_NODELIST:-}" || -z "${SLURM_NNODES:-}" ]]; then
    echo "slurm_launch.sh: not inside a SLURM allocation (run it with sbatch or salloc -N N --ntasks-per-node=1)" >&2
    exit 2
fi
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$first" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
# one task a node: SLURM_NODEID is the node's number in the allocation, the launcher's --node-rank
exec srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 bash -c \
    'exec "$0" -m prism.cli launch --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --master-addr "$1" \
         --master-port "$2" "${@:3}"' "${PRISM_PYTHON:-python3}" "${addr:-$first}" "${PRISM_MASTER_PORT:-29500}" "$@"

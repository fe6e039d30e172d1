"""SLURM: an sbatch script that starts one torchrun per node running the Megatron-LM command.

Convention 1 of launchers.md §6.2 (one task per node + torchrun, c10d rendezvous on the first
node of the allocation): `#SBATCH --nodes=N --ntasks-per-node=1 --gpus-per-node=G`, then
`srun torchrun --nnodes N --nproc-per-node G --rdzv-id $SLURM_JOB_ID --rdzv-backend c10d
--rdzv-endpoint $HEAD_NODE:29500 pretrain_gpt.py ...`. torchrun gives each node a contiguous
block of ranks (launchers.md §6.1), which keeps TP groups inside a node as the cost model
assumes. What it can express is exactly what the Megatron target can.
"""

from __future__ import annotations

import re

from ..errors import ExportError
from ._base import Exporter, Job, comments
from .megatron import (MEGATRON_IGNORES, RDZV_PORT, Raw, command_lines, environment,
                       megatron_limits, notes)


TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}"
                  r"|\d+-\d+:\d{1,2}:\d{1,2}|INFINITE|UNLIMITED)$", re.IGNORECASE)
"""sbatch `--time` forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
days-hours:minutes, days-hours:minutes:seconds (sbatch(1) manual, option --time), and no limit
as INFINITE or UNLIMITED in any case (SLURM src/common/parse_time.c `time_str2secs`). SLURM adds
the fields up without bounding them (`time_str2secs` returns d + h + m + s), so 1:90:00 is
2 h 30 min to sbatch and is taken as written."""
NAME = re.compile(r"^[A-Za-z0-9_.,:+-]+$")
"""Partition, account and QOS names as written on an #SBATCH line (no blanks or quotes)."""
SBATCH_OPTIONS = ("time", "partition", "account", "qos")
"""Optional #SBATCH settings, written only when given."""


def sbatch_options(**given: str | None) -> dict[str, str]:
    """The given #SBATCH settings, checked; ExportError naming the option otherwise."""
    out = {}
    for key in SBATCH_OPTIONS:
        value = given.get(key)
        if value is None:
            continue
        value = str(value).strip()
        pattern = TIME if key == "time" else NAME
        if not pattern.match(value):
            what = ("minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (e.g. 2:00:00) or "
                    "UNLIMITED"
                    if key == "time" else "a name of letters, digits and _ . , : + - (no blanks, quotes or shell characters)")
            raise ExportError(f"--{key} {value!r}: sbatch takes {what}")
        out[key] = value
    return out


class SlurmExporter(Exporter):
    """sbatch script: N nodes x 1 task, srun torchrun ... pretrain_gpt.py."""

    name = "slurm"
    ignores = MEGATRON_IGNORES
    trains_hybrid = True  # runs the Megatron-LM script (pretrain_mamba.py for a hybrid)
    suffix = ".sh"
    uneven_splits = True
    partial_recompute = True
    named_recompute = activation_offload = module_offload = optimizer_offload = True
    summary = "sbatch script: srun torchrun (c10d rendezvous) running the Megatron-LM command"

    def __init__(self, **options: str | None):
        self.options = sbatch_options(**options)

    def limits(self, job: Job) -> list[str]:
        return megatron_limits(job)

    def text(self, job: Job) -> str:
        name = f"ap-{job.problem.model.name}"
        sbatch = [
            "#!/bin/bash",
            f"#SBATCH --job-name={name}",
            f"#SBATCH --nodes={job.n_nodes}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --gpus-per-node={job.gpus_per_node}",
        ] + [f"#SBATCH --{k}={v}" for k, v in self.options.items()]
        head = comments(job.header + notes(job)
                        + ["Submit with: sbatch THIS.sh [more Megatron-LM arguments]"])
        body = [
            "set -euo pipefail",
            '# sed reads the whole list: with pipefail, head could fail the script through SIGPIPE',
            'HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        ] + environment(job)
        torchrun = [["srun", "torchrun", "--nnodes", job.n_nodes,
                     "--nproc-per-node", job.gpus_per_node, "--rdzv-id", Raw('"$SLURM_JOB_ID"'),
                     "--rdzv-backend", "c10d"],
                    ["--rdzv-endpoint", Raw(f'"$HEAD_NODE:{RDZV_PORT}"')]]
        return "\n".join(sbatch + head + body + command_lines(job, torchrun)) + "\n"

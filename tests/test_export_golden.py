"""Golden exports of the reference layout of launchers.md §0 (Llama-3-70B, 64 H100, TP8+SP, PP4,
VP5, DP2, distributed optimizer, selective recompute, MBS 1, GBS 512, seq 8192), reviewed line by
line against launchers.md in tests/golden/reference/REVIEW.md.

To accept a deliberate change: UPDATE_GOLDEN=1 python -m pytest tests/test_export_golden.py,
review the diff against REVIEW.md, and commit both.
"""

import os
from pathlib import Path

import pytest

from conftest import run_cli
from launcher_checks import (
    deepspeed_layout, megatron_script_layout, nanotron_layout, sbatch_layout, torchtitan_layout,
    torchtitan_module_layout,
)

GOLDEN = Path(__file__).parent / "golden" / "reference"
PROBLEM = ["--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq-len", "8192",
           "--global-batch", "512"]
REFERENCE = ["--tp", "8", "--pp", "4", "--vp", "5", "--zero", "1", "--recompute", "selective",
             "--micro-batch", "1"]
CLOSEST_NANOTRON = ["--tp", "8", "--pp", "4", "--zero", "1", "--recompute", "none",
                    "--micro-batch", "1"]
CASES = {
    "megatron.sh": ("megatron", REFERENCE, 0),
    "slurm.sh": ("slurm", REFERENCE, 0),
    "torchtitan.py": ("torchtitan", REFERENCE, 0),
    "torchtitan-0.2.2.toml": ("torchtitan", REFERENCE + ["--target-version", "0.2.2"], 0),
    "deepspeed.refusal.txt": ("deepspeed", REFERENCE, 2),
    "deepspeed-dp64-z3-full.json": ("deepspeed", ["--dp", "64", "--zero", "3", "--recompute",
                                                  "full"], 0),
    "nanotron.refusal.txt": ("nanotron", REFERENCE, 2),
    "nanotron-vp1-no-recompute.yaml": ("nanotron", CLOSEST_NANOTRON, 0),
}


@pytest.mark.parametrize("name", CASES)
def test_reference_export_matches_golden(name):
    target, layout, code = CASES[name]
    r = run_cli("export", "--target", target, *PROBLEM, *layout)
    assert r.returncode == code, r.stderr
    got = r.stdout if code == 0 else r.stderr  # (stderr of a DeepSpeed export: its note)
    assert "Traceback" not in r.stdout + r.stderr
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert got == path.read_text(), f"{name} differs from its golden (see module doc)"


def test_reference_goldens_launch_the_reference_layout():
    """The goldens themselves, read by the launcher readers, give the §0 layout."""
    ref = dict(dp=2, tp=8, pp=4, vp=5, cp=1, ep=1, zero=1, recompute="selective", sp=True,
               micro_batch=1, micro_batches=256, world=64)
    for reader, name in ((megatron_script_layout, "megatron.sh"), (sbatch_layout, "slurm.sh")):
        got = reader((GOLDEN / name).read_text())
        assert {k: got[k] for k in ref} == ref
        assert (got["nodes"], got["per_node"]) == (8, 8)
    titan = torchtitan_layout((GOLDEN / "torchtitan-0.2.2.toml").read_text(), 64, 80)
    assert {k: titan[k] for k in ref} == ref | {"zero": 2}  # ZeRO-1 -> FSDP "never" (documented)
    assert titan["model"] == ("llama3", "70B")
    titan = torchtitan_module_layout((GOLDEN / "torchtitan.py").read_text(), 64, 80)
    assert {k: titan[k] for k in ref} == ref | {"zero": 2}
    assert titan["model"] == ("llama3", "llama3_70b")
    ds = deepspeed_layout((GOLDEN / "deepspeed-dp64-z3-full.json").read_text(), 64)
    assert (ds["dp"], ds["zero"], ds["recompute"], ds["overlap_comm"]) == (64, 3, "full", True)
    nano = nanotron_layout((GOLDEN / "nanotron-vp1-no-recompute.yaml").read_text(), 64)
    assert {k: nano[k] for k in ref} == ref | {"vp": 1, "recompute": "none"}
    assert nano["pp_engine"] == "1f1b"


def test_refusal_goldens_name_each_missing_feature():
    ds = (GOLDEN / "deepspeed.refusal.txt").read_text().splitlines()
    assert ds[0] == "error: deepspeed cannot launch dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1:"
    assert [line.split(":")[0].strip() for line in ds[1:4]] == [
        "- tensor parallelism (tp = 8)", "- pipeline parallelism (pp = 4, vp = 5)",
        "- recompute = selective"]
    assert ds[-1].strip() == ("targets that can launch it: megatron, torchtitan, slurm, "
                              "megatron-bridge")
    nano = (GOLDEN / "nanotron.refusal.txt").read_text()
    assert "interleaving (vp = 5)" in nano and "selective recompute" in nano

"""Exports read by a launcher's own config class, where that class installs on a CPU machine.

DeepSpeed: `deepspeed.runtime.config.DeepSpeedConfig` works with the CPU build of torch
(`pip install torch --index-url https://download.pytorch.org/whl/cpu deepspeed`). It is not a
dependency of autoparallel (CI installs `.[test]` only), so this module is skipped where DeepSpeed
is not importable. TorchTitan's ConfigManager (TOML releases <= v0.2.2) imports triton/CUDA
kernels when its package loads, and Nanotron and Megatron-LM import torch and CUDA extensions, so
those are checked by the independent readers in tests/launcher_checks.py instead (docs/export.md).
"""

import json

import numpy as np
import pytest

deepspeed_config = pytest.importorskip(
    "deepspeed.runtime.config",
    reason="DeepSpeed is not installed (it needs torch; the CPU wheel is enough)")

from autoparallel import make_problem  # noqa: E402
from autoparallel.exporters import check, render  # noqa: E402
from autoparallel.search.enumerate import enumerate_layouts  # noqa: E402


class _DataParallelOnly:
    """The `mpu` DeepSpeed asks for the data-parallel size (launchers.md §4.1)."""

    def __init__(self, world: int):
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


@pytest.mark.parametrize("model,gpus,seq,gbs", [("llama3-8b", 8, 4096, 64),
                                                ("llama3-8b", 64, 4096, 512)])
def test_deepspeed_config_class_accepts_every_export(monkeypatch, tmp_path, model, gpus, seq, gbs):
    # without a process group DeepSpeedConfig falls back to world size 1; pretend rank 0
    monkeypatch.setattr(deepspeed_config.dist, "get_rank", lambda *a, **k: 0)
    problem = make_problem(model, "h100", gpus, seq_len=seq, global_batch=gbs)
    table = enumerate_layouts(problem)
    written = 0
    for i in np.flatnonzero((table["tp"] == 1) & (table["pp"] == 1) & (table["cp"] == 1)):
        layout = table.row(int(i))
        if check("deepspeed", problem, layout):
            continue
        path = tmp_path / "ds.json"
        path.write_text(render("deepspeed", problem, layout))
        cfg = deepspeed_config.DeepSpeedConfig(str(path), mpu=_DataParallelOnly(gpus))
        data = json.loads(path.read_text())
        assert cfg.world_size == gpus
        assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                cfg.gradient_accumulation_steps) == (gbs, layout.micro_batch,
                                                     gbs // (gpus * layout.micro_batch))
        assert int(cfg.zero_optimization_stage) == layout.zero == data["zero_optimization"]["stage"]
        assert cfg.bfloat16_config.enabled
        written += 1
    assert written > 0
    data["gradient_accumulation_steps"] += 1  # DeepSpeed itself refuses a wrong batch
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_config.DeepSpeedConfig(data, mpu=_DataParallelOnly(gpus))

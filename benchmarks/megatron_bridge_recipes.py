"""Extract the settings of NVIDIA's Megatron-Bridge performance recipes, release by release,
into `autoparallel/data/megatron_bridge_recipes.csv`: what each published benchmark ran beyond
the layout its performance table prints (activation recompute and CPU offloading, Megatron
FSDP, CUDA graphs, TP-communication overlap per precision). `validate` joins the table to the
Megatron-Bridge rows of published_runs.csv whose layout it matches (`validation.recipes`).

Needs a git clone of github.com/NVIDIA-NeMo/Megatron-Bridge; PyYAML for the 25.09 release
(v0.1.0rc4), whose recipes are YAML perf matrices. Each release's
`scripts/performance/configs/**/*workload_base_configs.py` is executed with that release's own
`WorkloadBaseConfig` dataclass (read from `scripts/performance/utils/utils.py`) and nothing else
of the project imported. Prints what it extracted; nothing is asserted.

    python benchmarks/megatron_bridge_recipes.py --repo PATH/TO/Megatron-Bridge [--out FILE]
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import re
import subprocess
import sys
import types
import typing
from pathlib import Path

TAGS = ("v0.1.0rc4", "v0.2.0", "v0.2.2", "v0.3.0", "v0.3.1", "v0.4.0", "v0.4.1", "v0.4.2",
        "v0.5.0", "v0.5.1")
"""Megatron-Bridge releases with `scripts/performance` recipes (v0.6.0 moved to the flat
`perf_recipes` package, whose settings are Python code rather than tables)."""

COLUMNS = ("first_tag", "last_tag", "file", "config", "model", "task", "gpu", "precision", "variant", "num_gpus",
           "tp", "pp", "cp", "vp", "ep", "etp", "mbs", "gbs", "use_megatron_fsdp",
           "cpu_offloading_num_layers", "recompute_num_layers", "recompute_modules",
           "cuda_graph_impl", "cuda_graph_scope", "moe_a2a_overlap", "tp_comm_overlap")

NAME = re.compile(
    r"^(?P<model>[A-Z0-9_]+?)_(?:(?P<task>PRETRAIN|SFT|LORA|PEFT|FINETUNE)_CONFIG_)?"
    r"(?P<gpu>GB300|GB200|B300|B200|H100|H200|VR200|R100)_"
    r"(?P<prec>BF16|FP8_CS|FP8_MX|FP8_DS|NVFP4|FP8)(?:_(?P<variant>.+))?$")


def git_show(repo: Path, tag: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{tag}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def git_files(repo: Path, tag: str, under: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", tag, under],
                         check=True, capture_output=True, text=True).stdout
    return out.split()


def base_config_class(repo: Path, tag: str):
    """The release's `WorkloadBaseConfig` dataclass, executed alone (its module imports the
    project; the class needs only dataclasses and typing)."""
    src = git_show(repo, tag, "scripts/performance/utils/utils.py")
    tree = ast.parse(src)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WorkloadBaseConfig")
    ns = {"dataclass": dataclasses.dataclass, **{k: getattr(typing, k) for k in typing.__all__}}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "utils.py", "exec"), ns)  # noqa: S102
    return ns["WorkloadBaseConfig"]


def _value(cfg, name):
    v = getattr(cfg, name, None)
    if isinstance(v, (list, tuple)):
        return "+".join(str(x) for x in v)
    return "" if v is None else v


def python_recipes(repo: Path, tag: str) -> list[dict]:
    cls = base_config_class(repo, tag)
    utils = types.ModuleType("utils.utils")
    utils.WorkloadBaseConfig = cls
    sys.modules["utils"] = types.ModuleType("utils")
    sys.modules["utils.utils"] = utils
    rows = []
    for path in git_files(repo, tag, "scripts/performance/configs"):
        if not path.endswith("workload_base_configs.py"):
            continue
        ns: dict = {"__name__": "workload_base_configs"}
        exec(compile(git_show(repo, tag, path), path, "exec"), ns)  # noqa: S102
        for name, cfg in ns.items():
            m = NAME.match(name)
            if not m or not isinstance(cfg, cls):
                continue
            rows.append({
                "tag": tag, "file": path, "config": name, "model": m["model"],
                "task": (m["task"] or "PRETRAIN"), "gpu": m["gpu"], "precision": m["prec"],
                "variant": m["variant"] or "", "num_gpus": cfg.num_gpus,
                "tp": cfg.tensor_model_parallel_size, "pp": cfg.pipeline_model_parallel_size,
                "cp": cfg.context_parallel_size,
                "vp": cfg.virtual_pipeline_model_parallel_size or 1,
                "ep": cfg.expert_model_parallel_size,
                "etp": _value(cfg, "expert_tensor_parallel_size"),
                "mbs": cfg.micro_batch_size, "gbs": cfg.global_batch_size,
                **{k: _value(cfg, k) for k in ("use_megatron_fsdp", "cpu_offloading_num_layers",
                                                "recompute_num_layers", "recompute_modules",
                                                "cuda_graph_impl", "cuda_graph_scope",
                                                "moe_a2a_overlap")},
                "tp_comm_overlap": "",
            })
    return rows


YAML_PRECISIONS = {"bf16": "BF16", "fp8_cs": "FP8_CS", "fp8_ds": "FP8_DS", "fp8_mx": "FP8_MX",
                   "nvfp4": "NVFP4"}


def yaml_recipes(repo: Path, tag: str) -> list[dict]:
    """v0.1.0rc4 (NeMo 25.09): `perf_matrix` blocks of `configs/<family>/<model>_llm_<task>.yaml`,
    gpu -> num_gpus_N -> common + per-precision overrides."""
    import yaml

    rows = []
    for path in git_files(repo, tag, "scripts/performance/configs"):
        m = re.search(r"/([a-z0-9]+_[0-9a-z]+)_llm_(pretrain|finetune)\.yaml$", path)
        if not m:
            continue
        doc = yaml.safe_load(git_show(repo, tag, path)) or {}
        for gpu, by_n in (doc.get("perf_matrix") or {}).items():
            for key, block in by_n.items():
                common = block.get("common", {})
                for prec, over in block.items():
                    if prec == "common" or prec not in YAML_PRECISIONS:
                        continue
                    c = {**common, **(over or {})}
                    graphs = c.get("cuda_graphs")
                    rows.append({
                        "tag": tag, "file": path, "config": f"{gpu}/{key}/{prec}",
                        "model": m[1].upper(), "task": m[2].upper(), "gpu": gpu.upper(),
                        "precision": YAML_PRECISIONS[prec], "variant": "",
                        "num_gpus": int(key.split("_")[-1]), "tp": c.get("tp", 1),
                        "pp": c.get("pp", 1), "cp": c.get("cp", 1), "vp": c.get("vp") or 1,
                        "ep": c.get("ep", 1), "etp": c.get("etp") or "", "mbs": c.get("mbs", 1),
                        "gbs": c.get("gbs", ""), "use_megatron_fsdp": c.get("use_megatron_fsdp", ""),
                        "cpu_offloading_num_layers": c.get("cpu_offloading_num_layers", ""),
                        "recompute_num_layers": c.get("recompute_num_layers", ""),
                        "recompute_modules": "+".join(c.get("recompute_modules") or []),
                        "cuda_graph_impl": "" if graphs is None else ("local" if graphs else "none"),
                        "cuda_graph_scope": "", "moe_a2a_overlap": "", "tp_comm_overlap": "",
                    })
    return rows


def nvfp4_tp_overlap_off(repo: Path, tag: str) -> bool:
    """Whether the release's Llama pretrain recipes turn TP-communication overlap off for NVFP4
    (`cfg.comm_overlap.tp_comm_overlap = False if precision == "nvfp4" ...`)."""
    for path in git_files(repo, tag, "scripts/performance/configs"):
        if re.search(r"llama3?1?/llama3?1?_llm_pretrain\.py$", path):
            if re.search(r'tp_comm_overlap\s*=\s*False\s+if\s+precision\s*==\s*"nvfp4"',
                         git_show(repo, tag, path)):
                return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="git clone of NVIDIA-NeMo/Megatron-Bridge")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "autoparallel"
                                         / "data" / "megatron_bridge_recipes.csv"))
    args = ap.parse_args()
    repo = Path(args.repo)
    rows = []
    for tag in TAGS:
        got = yaml_recipes(repo, tag) if tag.startswith("v0.1") else python_recipes(repo, tag)
        if nvfp4_tp_overlap_off(repo, tag):
            for r in got:
                if r["precision"] == "NVFP4" and r["model"].startswith("LLAMA"):
                    r["tp_comm_overlap"] = False
        print(f"{tag}: {len(got)} recipes")
        rows.extend(got)
    rows = merge_releases(rows)
    with open(args.out, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} distinct recipes (a config unchanged over consecutive releases is one "
          f"row, first_tag..last_tag) -> {args.out}")


def merge_releases(rows: list[dict]) -> list[dict]:
    """One row per config and run of consecutive releases in which its settings do not change."""
    order = {t: i for i, t in enumerate(TAGS)}
    keyed: dict = {}
    for r in rows:
        keyed.setdefault((r["model"], r["task"], r["gpu"], r["precision"], r["variant"],
                          r["config"]), []).append(r)
    out = []
    for group in keyed.values():
        group.sort(key=lambda r: order[r["tag"]])
        run = None
        for r in group:
            settings = {k: str(v) for k, v in r.items() if k not in ("tag", "file")}
            if run and run["_settings"] == settings and order[r["tag"]] == order[run["last_tag"]] + 1:
                run["last_tag"] = r["tag"]
                continue
            run = {**r, "first_tag": r["tag"], "last_tag": r["tag"], "_settings": settings}
            out.append(run)
    for r in out:
        del r["_settings"], r["tag"]
    return sorted(out, key=lambda r: (r["model"], r["gpu"], r["precision"], r["task"],
                                      order[r["first_tag"]], r["config"]))


if __name__ == "__main__":
    main()

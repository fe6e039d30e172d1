"""Mine the MoE settings the shared runs leave out (expert TP, dispatcher, all-to-all overlap,
CUDA graphs, recompute modules) from Megatron-Bridge's performance configs, row by row, with the
source of every value; writes `autoparallel/data/moe_settings.csv`.

Megatron-Bridge's performance tables (`docs/performance-summary*.md`, the rows of
`megatron_bridge_perf`) are produced by `scripts/performance` with the workload presets of
`scripts/performance/configs/<family>/*workload_base_configs.py` (v0.2.0 - v0.5.1; from v0.6.0
the `perf_recipes` functions). A preset is `NAME = replace(BASE, field=value, ...)` or
`NAME = OTHER`, named `<MODEL>_<SIZE>_..._<GPU>_<PRECISION>_...`; this script evaluates those
assignments with Python's `ast` (no import of the package), and assigns a preset to a row when
model, GPU, precision and the whole layout (GPUs, TP, PP, VP, EP, CP, micro-batch, global batch)
agree; among matching releases the one nearest the row's table release wins. Fields the preset
does not set keep `WorkloadBaseConfig`'s defaults (no flex backend, no overlap, no graphs,
expert TP = TP) and the benchmark scripts' common settings (`*_llm_pretrain.py`: forced load
balancing, selective recompute of the listed modules).

Run: python benchmarks/mine_bridge_recipes.py --repo /path/to/Megatron-Bridge [--write]
(a git clone; every tag v0.2.0 ... v0.5.1 is read with `git show`). `--write` replaces the mined
values and keeps those the side table holds read by hand (corrected layouts, launch configs of
other sources).
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel.output.files import write_whole  # noqa: E402

HERE = Path(__file__).resolve().parent
RUNS = HERE.parent / "autoparallel" / "data" / "published_runs.csv"
OUT = HERE.parent / "autoparallel" / "data" / "moe_settings.csv"
TAGS = ("v0.2.0", "v0.2.1", "v0.2.2", "v0.3.0", "v0.3.1", "v0.4.0", "v0.4.1", "v0.4.2",
        "v0.5.0", "v0.5.1")
RELEASE_OF_TAG = {"v0.2.0": "25.11", "v0.2.1": "25.11", "v0.2.2": "26.02", "v0.3.0": "26.02",
                  "v0.3.1": "26.02.01", "v0.4.0": "26.04", "v0.4.1": "26.04.01",
                  "v0.4.2": "26.04.01", "v0.5.0": "26.06", "v0.5.1": "26.06.01"}
"""NeMo container release each Megatron-Bridge tag shipped in (tag dates against the
performance-summary release headings)."""
DEFAULTS = {"num_gpus": 1, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "context_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
            "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
            "global_batch_size": 1, "micro_batch_size": 1, "cuda_graph_impl": None,
            "cuda_graph_scope": None, "recompute_modules": None,
            "moe_flex_dispatcher_backend": None, "moe_a2a_overlap": False}
"""`scripts/performance/utils/utils.py` `WorkloadBaseConfig` field defaults (v0.4.0)."""
FAMILY = {"deepseek": r"^DEEPSEEK_V3", "qwen3_30b": r"^QWEN3_30B_A3B", "qwen3_235b":
          r"^QWEN3_235B_A22B", "gpt_oss": r"^GPT_OSS_120B", "kimi": r"^KIMI_K2",
          "nemotron_3_nano": r"^NEMOTRON_3_NANO", "nemotron_3_super": r"^NEMOTRON_3_SUPER",
          "nemotron_3_ultra": r"^NEMOTRON_3_ULTRA"}
"""Preset name prefixes per model family of the MoE rows."""
MODEL_FAMILY = ((r"deepseek ?v3", "deepseek"), (r"qwen3_30b|qwen3 moe 30b", "qwen3_30b"),
                (r"qwen3_235b", "qwen3_235b"), (r"gpt[ _-]?oss[ _-]?120b", "gpt_oss"),
                (r"kimi", "kimi"), (r"nemotron_3_nano", "nemotron_3_nano"),
                (r"nemotron_3_super", "nemotron_3_super"), (r"nemotron_3_ultra", "nemotron_3_ultra"))
"""Row model names per family; the hybrid Nemotron-3 rows (blank `arch_type`) are MoE too."""
PRECISION = {"bf16": "BF16", "fp8-mx": "FP8_MX", "mxfp8": "FP8_MX", "fp8-cs": "FP8_CS",
             "fp8": "FP8_CS", "nvfp4": "NVFP4", "fp8-sc": "FP8_SC"}


RECIPE_FUNCTIONS = {
    # Megatron-Bridge v0.6.0 (51885cf132) builds these rows' benchmarks with perf_recipes
    # functions, not WorkloadBaseConfig presets: the values below are read from the function
    # bodies (src/megatron/bridge/perf_recipes/nemotronh/{gb300,gb200}/nemotronh.py and
    # common.py `_apply_nemotron_3_ultra_perf_defaults`: flex dispatcher backend hybridep,
    # cuda_graph_impl "none", moe_router_force_load_balancing, expert_tensor_parallel_size 1,
    # recompute_modules ["moe_act"]; common.py `_apply_nemotron_3_ultra_fsdp_hsdp`:
    # use_megatron_fsdp, data_parallel_sharding_strategy "optim_grads_params" = ZeRO-3, sharded
    # within each NVLink domain and optimizer-sharded across them, which the ledger prices as
    # ZeRO-3 over the whole DP group; fine_grained_activation_offloading with offload_modules
    # ["fused_group_mlp"] and min_offloaded_tensor_size ~ the moe_act input, "approximates
    # offloading the moe_act input", i.e. offload_modules moe_act).
    ("Nemotron_3_Ultra", "GB300"): ("v0.6.0", "51885cf132",
                                    "src/megatron/bridge/perf_recipes/nemotronh/gb300/nemotronh.py",
                                    "nemotron_3_ultra_pretrain_256gpu_gb300_fp8mx_config"),
    ("Nemotron_3_Ultra", "GB200"): ("v0.6.0", "51885cf132",
                                    "src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py",
                                    "nemotron_3_ultra_pretrain_256gpu_gb200_fp8mx_config"),
}
"""Rows whose recipe is a v0.6.0 `perf_recipes` function (read by hand; see the comment)."""
RECIPE_FUNCTION_SETTINGS = {"etp": "1", "moe_dispatcher": "hybridep", "moe_a2a_overlap": "false",
                            "cuda_graphs": "none", "moe_routing": "balanced",
                            "recompute_modules": "moe_act", "zero": "3",
                            "offload_modules": "moe_act"}


def git_show(repo: str, tag: str, path: str) -> str | None:
    r = subprocess.run(["git", "-C", repo, "show", f"{tag}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def preset_files(repo: str, tag: str) -> list[str]:
    r = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", tag],
                       capture_output=True, text=True, check=True)
    return [p for p in r.stdout.split() if re.search(r"scripts/performance/configs/.*"
                                                     r"workload_base_configs\.py$", p)]


def _value(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def evaluate_presets(text: str) -> dict[str, dict]:
    """Module-level `NAME = WorkloadBaseConfig(...)`, `NAME = replace(BASE, ...)` and
    `NAME = OTHER` assignments, evaluated in order into dicts of fields."""
    env: dict[str, dict] = {}
    for stmt in ast.parse(text).body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            continue
        name, v = stmt.targets[0].id, stmt.value
        if isinstance(v, ast.Name) and v.id in env:
            env[name] = dict(env[v.id])
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name):
            if v.func.id == "WorkloadBaseConfig":
                base = dict(DEFAULTS)
            elif v.func.id == "replace" and v.args and isinstance(v.args[0], ast.Name) \
                    and v.args[0].id in env:
                base = dict(env[v.args[0].id])
            else:
                continue
            for kw in v.keywords:
                if kw.arg:
                    base[kw.arg] = _value(kw.value)
            env[name] = base
    return env


def row_family(model: str) -> str | None:
    m = model.lower()
    return next((fam for pat, fam in MODEL_FAMILY if re.search(pat, m)), None)


def row_precision(p: str) -> str | None:
    p = p.lower().replace("(implied)", "").strip()
    return PRECISION.get(p) or ("FP8_CS" if p.startswith("fp8") else None)


def _num(x):
    try:
        return int(float(x))
    except (TypeError, ValueError):
        return None


def layout_key(cfg: dict) -> tuple:
    return (cfg["num_gpus"], cfg["tensor_model_parallel_size"], cfg["pipeline_model_parallel_size"],
            cfg["virtual_pipeline_model_parallel_size"] or 1, cfg["expert_model_parallel_size"],
            cfg["context_parallel_size"], cfg["micro_batch_size"], cfg["global_batch_size"])


def row_key(row: dict) -> tuple:
    return tuple(_num(row.get(c)) or d for c, d in (
        ("num_gpus", 1), ("tp", 1), ("pp", 1), ("vpp", 1), ("ep", 1), ("cp", 1), ("mbs", 1),
        ("gbs", 1)))


def settings(cfg: dict) -> dict[str, str]:
    """The job settings and recompute the preset implies (module docstring)."""
    backend = cfg.get("moe_flex_dispatcher_backend")
    impl, scope = cfg.get("cuda_graph_impl"), cfg.get("cuda_graph_scope") or []
    scope = [scope] if isinstance(scope, str) else list(scope)
    # Megatron-Bridge utils/cuda_graph.py `is_full_iteration_cuda_graph`: the whole step is
    # captured for impl "full_iteration" (whatever the scope; v0.5.x gpt-oss MXFP8 presets) or
    # impl "local" with a "full_iteration" scope; any other impl is not a whole-step capture
    # (transformer_engine captures the scope's modules, and a "full_iteration" entry there
    # names none of them); "local" with an empty scope, which Bridge's
    # validate_cuda_graph_configuration refuses, stays read as full, as before
    modules = [s for s in scope if s != "full_iteration"]
    if impl == "full_iteration" or impl == "local" and (not scope or "full_iteration" in scope):
        graphs = "full"
    elif impl in (None, "none", "None") or not modules:
        graphs = "none"
    else:
        graphs = "scoped"
    etp = cfg.get("expert_tensor_parallel_size")
    out = {"etp": str(etp if etp is not None else cfg["tensor_model_parallel_size"]),
           "moe_dispatcher": backend if backend in ("deepep", "hybridep") else "alltoall",
           "moe_a2a_overlap": str(bool(cfg.get("moe_a2a_overlap"))).lower(),
           "cuda_graphs": graphs, "moe_routing": "balanced"}
    mods = cfg.get("recompute_modules")
    if isinstance(mods, list) and mods:
        out["recompute_modules"] = "+".join(mods)
    return out


def mine(repo: str) -> list[dict]:
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    presets = []  # (tag, path, name, cfg)
    for tag in TAGS:
        commit = subprocess.run(["git", "-C", repo, "rev-list", "-n1", tag], capture_output=True,
                                text=True).stdout.strip()
        for path in preset_files(repo, tag):
            text = git_show(repo, tag, path)
            for name, cfg in evaluate_presets(text or "").items():
                presets.append((tag, commit, path, name, cfg))
    rows = list(csv.DictReader(open(RUNS, newline="")))
    out = []
    for row in rows:
        fam, prec = row_family(row["model"]), row_precision(row["precision"])
        moe_row = str(row["arch_type"]).startswith("moe") or (
            not row["arch_type"] and fam is not None and fam.startswith("nemotron_3"))
        if row["source_key"] != "megatron_bridge_perf" or not moe_row:
            continue
        if fam is None or prec is None:
            continue
        gpu = re.sub(r"[^A-Z0-9]", "", row["gpu"].upper().split()[0])
        release = str(row["source_locator"]).split(" ")[0]
        by_hand = RECIPE_FUNCTIONS.get((row["model"], gpu))
        if by_hand is not None:
            tag, commit, path, name = by_hand
            for field, value in RECIPE_FUNCTION_SETTINGS.items():
                out.append({"row_id": row["row_id"], "field": field, "value": value,
                            "source": f"NVIDIA-NeMo/Megatron-Bridge@{tag} ({commit}) {path} "
                                      f"{name} (read by hand)"})
            continue
        want = row_key(row)
        found = []
        for tag, commit, path, name, cfg in presets:
            if not re.search(FAMILY[fam], name) or f"_{gpu}_" not in f"_{name}_":
                continue
            if prec not in name and not (prec == "FP8_CS" and "FP8" in name and "MX" not in name):
                continue
            if "LORA" in name or "SFT" in name:
                continue
            if layout_key(cfg) == want:
                found.append((tag, commit, path, name, cfg))
        if not found:
            continue
        # the release nearest the row's: the same release if any, else the latest before it
        same = [f for f in found if RELEASE_OF_TAG[f[0]] == release]
        earlier = [f for f in found if RELEASE_OF_TAG[f[0]] <= release]
        pick = (same or earlier or found)[-1]
        tag, commit, path, name, cfg = pick
        for field, value in settings(cfg).items():
            out.append({"row_id": row["row_id"], "field": field, "value": value,
                        "source": f"NVIDIA-NeMo/Megatron-Bridge@{tag} ({commit[:10]}) {path} "
                                  f"{name} (layout matches the row)"})
    print(f"{len({r['row_id'] for r in out})} rows matched from {len(presets)} presets "
          f"(repo HEAD {head[:10]})", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a git clone of NVIDIA-NeMo/Megatron-Bridge")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name}")
    args = ap.parse_args()
    out = mine(args.repo)
    if args.write:
        # values read by hand (their source ends "(read by hand)": rows or fields no preset
        # gives) stay; every mined value is replaced
        mined = {(r["row_id"], r["field"]) for r in out}
        kept = [r for r in csv.DictReader(open(OUT, newline=""))
                if (r["row_id"], r["field"]) not in mined
                and r["source"].endswith("(read by hand)")] if OUT.exists() else []
        rows = sorted(out + kept, key=lambda r: r["row_id"])
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=["row_id", "field", "value", "source"],
                           lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        write_whole("--write", OUT, buf.getvalue())  # whole or not at all
        print(f"wrote {len(out)} mined values and kept {len(kept)} read by hand in {OUT}",
              file=sys.stderr)
    else:
        for r in out[:40]:
            print(r)


if __name__ == "__main__":
    main()

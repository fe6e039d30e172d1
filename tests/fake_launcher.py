"""A fake training job for the `tune` tests: a real subprocess that behaves like a short run.

    python fake_launcher.py --world WORLD.json --layout SLUG [--tp N --pp N ...] [--argv-out F]

It reads the layout from its arguments, sleeps briefly, and prints a few step times drawn from a
hidden "true" cost: the cost model's prediction (looked up in the world file, which the test
writes) times a hidden factor per axis value, times small noise. A layout whose predicted memory
times `memory_factor` exceeds `oom_gib` dies with a CUDA out-of-memory message instead. Layouts
listed under `hang` sleep for a long time (to test timeouts and killed workers); those under
`crash` exit with an error. Standard library only, so that it starts fast.
"""

import argparse
import json
import os
import random
import re
import sys
import time
import zlib


MEGATRON = {"--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
            "--context-parallel-size": "cp", "--micro-batch-size": "mb"}


def true_step_s(world: dict, slug: str) -> float:
    """The noise-free hidden step time of `slug`."""
    pred = world["predicted"][slug][0]
    factor = world.get("scale", 1.0)
    for part in slug.split("-"):
        m = re.fullmatch(r"([a-z]+?)(\d+)", part)
        axis, value = (m[1], m[2]) if m else ("flag", part)
        factor *= world.get("distortion", {}).get(axis, {}).get(value, 1.0)
    return pred * factor


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--layout", required=True)
    ap.add_argument("--argv-out")
    for axis in ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "micro-batch"):
        ap.add_argument(f"--{axis}", type=int)
    ap.add_argument("--recompute")
    for flag in MEGATRON:  # Megatron-LM's names for the same degrees ({megatron_args})
        ap.add_argument(flag, type=int)
    args, rest = ap.parse_known_args(argv)
    if args.argv_out:
        with open(args.argv_out, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")
    with open(args.world, encoding="utf-8") as f:
        world = json.load(f)
    slug = args.layout
    # the per-axis flags, when given, must agree with the slug (they come from one layout); an
    # uneven stage split (`pp16[7,8x14,7]`) and a context-parallel form (`cp8:a2a2+ring4`) are
    # not degree flags
    plain = re.sub(r":[^-]*", "", re.sub(r"\[[^\]]*\]", "", slug))
    for axis, key in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("vp", "vp"), ("cp", "cp"),
                      ("ep", "ep"), ("zero", "z"), ("micro_batch", "mb")):
        value = getattr(args, axis)
        if value is not None and f"-{key}{value}-" not in f"-{plain}-":
            print(f"error: --{axis} {value} disagrees with layout {slug}", file=sys.stderr)
            return 4
    for flag, key in MEGATRON.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and f"-{key}{value}-" not in f"-{plain}-":
            print(f"error: {flag} {value} disagrees with layout {slug}", file=sys.stderr)
            return 4
    if slug not in world["predicted"]:
        print(f"error: unknown layout {slug}", file=sys.stderr)
        return 3
    hang = world.get("hang", {})
    if slug in hang.get("layouts", []):
        marker = hang.get("once_marker")
        if marker is None or not os.path.exists(marker):
            if marker:  # written whole, then renamed: a reader never sees half a file
                with open(marker + ".tmp", "w", encoding="utf-8") as f:
                    json.dump({"slug": slug, "pid": os.getpid(), "ppid": os.getppid()}, f)
                os.replace(marker + ".tmp", marker)
            print(f"hanging on {slug}", flush=True)
            time.sleep(hang.get("sleep_s", 60))
    if slug in world.get("crash", []):
        print("Segmentation fault (core dumped)", file=sys.stderr)
        return 139
    time.sleep(world.get("sleep_s", 0.05))
    memory = world["predicted"][slug][1] * world.get("memory_factor", 1.0)
    if memory > world.get("oom_gib", float("inf")):
        print("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
              f"GPU 0 has a total capacity of 79.10 GiB ({memory:.1f} GiB needed)", file=sys.stderr)
        return 1
    rng = random.Random(zlib.crc32(f"{world.get('seed', 0)}:{slug}".encode()))
    base = true_step_s(world, slug)
    for it in range(1, 5):
        warm = 1.5 if it == 1 else 1.0  # the first step is slow (warm-up); tune drops it
        step = base * warm * (1 + world.get("noise", 0.0) * rng.gauss(0, 1))
        print(f"iteration {it}/4 | lm loss 3.21 | step_time_s={step:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

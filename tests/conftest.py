import subprocess
import sys
from pathlib import Path

import pytest

from autoparallel import make_problem

DATA = Path(__file__).parent / "data"
SEED_MODEL = str(DATA / "seed-70b.toml")


@pytest.fixture
def seed_problem():
    """The seed's 70B example: 64 x 80 GB, seq 8192 (global batch chosen so m >= pp)."""
    return make_problem(SEED_MODEL, "h100", 64, seq_len=8192, global_batch=512)


def run_cli(*args, input_text=None, cwd=None):
    """Run the installed CLI as a subprocess; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "autoparallel", *map(str, args)],
        capture_output=True, text=True, input=input_text, cwd=cwd, timeout=300,
    )


def with_args(base, args):
    """`base` argv with each `--flag value` pair of `args` replacing or appending."""
    argv = list(base)
    for i in range(0, len(args), 2):
        if args[i] in argv:
            argv[argv.index(args[i]) + 1] = args[i + 1]
        else:
            argv += args[i:i + 2]
    return argv

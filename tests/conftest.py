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
    # the seed keeps bf16 gradients: 2 + 2 + 12 = 16 bytes/parameter (its ledger.py)
    return make_problem(SEED_MODEL, "h100", 64, seq_len=8192, global_batch=512, grad_dtype="bf16")


def run_cli(*args, input_text=None, cwd=None):
    """Run the installed CLI as a subprocess; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "autoparallel", *map(str, args)],
        capture_output=True, text=True, input=input_text, cwd=cwd, timeout=300,
    )


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory):
    """URL of a real PostgreSQL server: $AUTOPARALLEL_TEST_POSTGRES_URL (started by .ci/run), or
    a throwaway one started here (tests/pgserver.py). Skips, with the reason, only when neither
    is possible."""
    import os
    import tempfile

    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("PostgreSQL tests: psycopg2 is not installed (pip install -e '.[test]')")
    url = os.environ.get("AUTOPARALLEL_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    import pgserver

    base = Path(tempfile.mkdtemp(prefix="autoparallel-pg-"))
    try:
        url = pgserver.start(base)
    except (pgserver.PostgresUnavailable, OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"PostgreSQL tests: cannot start a PostgreSQL server here ({exc})")
    try:
        yield url
    finally:
        pgserver.stop(base)
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def with_args(base, args):
    """`base` argv with each `--flag value` pair of `args` replacing or appending."""
    argv = list(base)
    for i in range(0, len(args), 2):
        if args[i] in argv:
            argv[argv.index(args[i]) + 1] = args[i + 1]
        else:
            argv += args[i:i + 2]
    return argv

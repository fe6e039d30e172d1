"""The planted-bug table of `benchmarks/mutants.py` stays current: every mutant still finds its
source text exactly once, changes it, and names tests that exist (running the mutants is the
benchmark's job: `python benchmarks/mutants.py`)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _mutants():
    spec = importlib.util.spec_from_file_location("mutants", ROOT / "benchmarks" / "mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutants", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_every_mutant_applies_once_and_names_real_tests():
    mod = _mutants()
    names = [m.name for m in mod.MUTANTS]
    assert len(names) == len(set(names)) and len(names) >= 40
    for m in mod.MUTANTS:
        src = (ROOT / "autoparallel" / m.file).read_text()
        assert src.count(m.old) == 1, (m.name, m.file)
        assert mod.apply(src, m) != src
        for t in m.tests:
            assert (ROOT / t.split("::")[0]).exists(), (m.name, t)

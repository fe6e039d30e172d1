"""The README is checked against the program: every `autoparallel` command line in its shell
examples is accepted by the command line (every flag exists), the cheap ones are run, and the
figures the README quotes are the figures those runs print (to the digits quoted)."""

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoparallel.cli import app
from autoparallel.output.frames import SWEEP_SCHEMA_VERSION
from autoparallel.schema import SCHEMA_VERSION, EstimateOut

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")
RUNNER = CliRunner()


def commands() -> list[list[str]]:
    """Every `autoparallel ...` line of the README's bash blocks as argv (continuation lines
    joined; comments, `[--optional ...]` parts and `...` placeholders left out)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", TEXT, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s\[--[^\]]*\]", "", line.split("  #")[0]).strip()
            if line.startswith("autoparallel ") and " ... " not in line + " ":
                out.append(shlex.split(line)[1:])
            if "&& autoparallel " in line:  # the quick start's `pip install ... && autoparallel`
                out.append(shlex.split(line.split("&& ", 1)[1])[1:])
    return out


def _run(argv: list[str]):
    res = RUNNER.invoke(app, argv, env={"COLUMNS": "200"})
    return res.exit_code, res.output


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_line_is_accepted(argv):
    """Parsed with `--help` appended: an unknown flag or command fails (exit 2), no work."""
    code, out = _run([*argv, "--help"])
    assert code == 0, out


def test_the_examples_cover_every_command():
    used = {argv[0] for argv in commands()}
    assert {"plan", "sweep", "estimate", "export", "capacity", "validate", "calibrate",
            "tune"} <= used, used


def test_quick_start_runs():
    (argv,) = [a for a in commands() if a[:1] == ["plan"] and "llama3-70b" in a
               and "--gpus" in a and a[a.index("--gpus") + 1] == "64"][:1]
    code, out = _run(argv)
    assert code == 0, out
    assert "write #1's launcher file:" in out and "--layout" in out


def test_estimate_example_runs_and_its_json_keys_are_the_documented_ones():
    (argv,) = [a for a in commands() if a[:1] == ["estimate"]]
    code, out = _run(argv)
    assert code == 0, out
    data = json.loads(out)
    block = re.search(r"JSON output \(GiB = 2\^30 bytes, seconds\):\n\n```\n(.*?)```", TEXT,
                      re.S).group(1)
    top = re.findall(r'(?:^|[{,]\s*)"(\w+)"(?=\s*[,:}]|\s*$)', _top_level(block), re.M)
    assert top == list(EstimateOut.model_fields) == list(data), top
    for key, value in data.items():  # the nested objects' keys as documented
        if isinstance(value, dict) and f'"{key}": {{' in block:
            listed = re.search(rf'"{key}": \{{(.*?)\}}', block, re.S).group(1)
            names = re.findall(r'"(\w+)"', listed)
            assert names == [k for k in value if k in names] and set(names) <= set(value), key


def _top_level(block: str) -> str:
    """The block without its nested `{...}` objects."""
    inner = block.strip()[1:-1]
    out, depth = [], 0
    for ch in inner:
        depth += ch == "{"
        if depth == 0:
            out.append(ch)
        depth -= ch == "}"
    return "{" + "".join(out) + "}"


def test_export_examples_run(tmp_path):
    for argv in commands():
        if argv[:1] != ["export"] or "--from" in argv:
            continue  # --from needs a sweep CSV
        out_path = tmp_path / Path(argv[argv.index("--output") + 1]).name
        argv = [*argv]
        argv[argv.index("--output") + 1] = str(out_path)
        code, out = _run(argv)
        assert code == 0, (argv, out)
        assert out_path.read_text()


def test_capacity_figures_quoted_are_the_ones_printed():
    quoted = re.search(r"the (\d+)-H100 row predicts ([\d.]+) M GPU-hours \(band ([\d.]+)-([\d.]+)"
                       r" M\)", TEXT)
    assert quoted, "the README's capacity example figure sentence is gone"
    n, mid, low, high = int(quoted[1]), *(quoted[i] for i in (2, 3, 4))
    (argv,) = [a for a in commands() if a[:1] == ["capacity"]]
    code, out = _run([*argv, "--format", "json"])
    assert code == 0, out
    row = next(r for r in json.loads(out)["rows"] if r["gpu"] == "h100" and r["n_gpus"] == n)
    for text, value in ((mid, row["gpu_hours"]), (low, row["gpu_hours_low"]),
                        (high, row["gpu_hours_high"])):
        digits = len(text.split(".")[1]) if "." in text else 0
        assert f"{value / 1e6:.{digits}f}" == text, (text, value)


def test_versions_quoted_are_the_current_ones():
    assert f"`SCHEMA_VERSION` (now {SCHEMA_VERSION};" in TEXT
    assert f"Columns (frozen, schema version {SWEEP_SCHEMA_VERSION}):" in TEXT

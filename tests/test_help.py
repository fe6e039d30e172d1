"""`--help` reads at 80 and 200 columns: every command's help, rendered through the command line,
keeps every option's flags, value names and help text whole (no "..." cut, no square bracket
eaten by a markup renderer, no line wider than the terminal), groups the options in panels
derived from their declarations, and `autoparallel --version` answers."""

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

import autoparallel
from autoparallel.cli import COMMANDS, app
from autoparallel.cli.help import PANEL_ORDER, option_names

RUNNER = CliRunner()


def _help(argv, width):
    res = RUNNER.invoke(app, [*argv, "--help"], env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    return res.output


def _flat(text: str) -> str:
    return " ".join(text.split())


def _params(name):
    group = get_command(app)
    cmd = group.get_command(None, name)
    import typer

    return cmd, typer.Context(cmd, info_name=name, parent=typer.Context(group, info_name="autoparallel"))


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_help_text_is_shown_whole(name, width):
    out = _help([name], width)
    assert "…" not in out, out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= width, out
    flat = _flat(out)
    cmd, ctx = _params(name)
    for p in cmd.get_params(ctx):
        assert option_names(p, ctx) in out, f"{option_names(p, ctx)!r} cut or missing:\n{out}"
        if p.help:  # the whole text, brackets included, wrapped but not altered
            assert _flat(p.help) in flat, f"help of {p.name} altered:\n{p.help}\n---\n{out}"
    brackets = sum(_flat(p.help or "").count("[") for p in cmd.get_params(ctx))
    assert flat.count("[") >= brackets


def test_literal_brackets_survive():
    """Texts the rich markup renderer used to eat: `[sweep]`, `[space]`, `[default: ...]`."""
    assert "a [sweep] table and an optional [space] table" in _flat(_help(["sweep"], 80))
    flat = _flat(_help(["export"], 80))
    assert "[default: even]" in flat and "[default: core_attn]" in flat


def test_panels_come_from_the_declarations():
    """Problem, Layout, Search, Job and Output panels in that order; every JobSpec field in the
    Job panel (a field added there lands in it with no list to edit), the axis filters in
    Layout, --format in Output."""
    from autoparallel.specs.job import JOB_FIELDS, job_flag

    out = _help(["plan"], 200)
    heads = [h for h in re.findall(r"^(\w[\w ()-]*):$", out, re.M)]
    shared = [h for h in heads if h in PANEL_ORDER]
    assert shared == list(PANEL_ORDER), heads
    sections = dict(re.findall(r"^(\w[\w ()-]*):\n(.*?)(?=^\S|\Z)", out, re.M | re.S))
    for name in JOB_FIELDS:
        assert job_flag(name) in sections["Job"], name
    assert "--tp LIST" in sections["Layout"] and "--format" in sections["Output"]
    assert "--space FILE" in sections["Search"] and "--top N" in sections["Search"]
    est = dict(re.findall(r"^(\w[\w ()-]*):\n(.*?)(?=^\S|\Z)", _help(["estimate"], 200),
                          re.M | re.S))
    from autoparallel.cli.options import layout_flag
    from autoparallel.specs.layout import Layout

    for name in Layout.model_fields:  # one option per Layout field, in the Layout panel
        assert layout_flag(name) in est["Layout"], name


HEAVY = ("numpy", "pandas", "optuna", "sqlalchemy", "matplotlib", "scipy", "pydantic", "yaml")


def _loaded(argv: list[str]) -> tuple[str, list[str]]:
    """(stdout, heavy top-level packages imported) of `autoparallel argv` in a fresh process."""
    import subprocess
    import sys

    code = ("import sys; from autoparallel.cli import main; rc = main(sys.argv[1:]); "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})) + "
            "sorted(m for m in sys.modules if m.startswith('autoparallel.cli.') and "
            "m.endswith('_cmd') or m.startswith('autoparallel.exporters.')), file=sys.stderr); "
            "sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env={"COLUMNS": "80", "PATH": ""}, timeout=300)
    assert res.returncode in (0, 1), res.stderr
    return res.stdout, eval(res.stderr.strip().splitlines()[-1])


def test_top_level_help_lists_every_command_without_importing_them():
    out, loaded = _loaded(["--help"])
    assert loaded == [], loaded
    for name, entry in COMMANDS.items():
        assert name in out and _flat(entry.summary)[:30] in _flat(out)


@pytest.mark.parametrize("argv,allowed", [
    (["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
      "--global-batch", "64"], {"numpy", "pydantic", "autoparallel.cli.plan_cmd",
                                "autoparallel.exporters._base", "autoparallel.exporters.megatron"}),
    (["estimate", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096",
      "--global-batch", "64", "--tp", "2"], {"numpy", "pydantic", "autoparallel.cli.estimate_cmd"}),
])
def test_a_command_imports_only_what_it_uses(argv, allowed):
    """A plan in memory needs no pandas, Optuna (no study was asked for), SQLAlchemy,
    matplotlib, scipy or yaml, no other command's module, and of the exporters only the one
    its export hint checks (megatron, for the default stack)."""
    _, loaded = _loaded(argv)
    assert set(loaded) <= allowed, loaded


def test_version():
    res = RUNNER.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"autoparallel {autoparallel.__version__}"
    from importlib.metadata import version

    assert version("autoparallel") == autoparallel.__version__  # one source: the package

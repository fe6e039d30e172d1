"""`--measure` templates: parsing, rendering as separate arguments, no shell injection, and the
exporter placeholders."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoparallel import Layout, make_problem
from autoparallel.errors import SpecError
from autoparallel.tune.command import PLACEHOLDERS, CommandTemplate, layout_values, render_exports

PROBLEM = make_problem("llama3-8b", "h100", 8, 4096, 64)
LAYOUT = Layout(dp=2, tp=2, pp=2, zero=1, micro_batch=1).resolved(8)


def values(**over):
    v = layout_values(PROBLEM, LAYOUT, trial=3, study="s", trial_dir=Path("/tmp/t"), grad_accum=32)
    return v | over


def test_each_placeholder_is_substituted_inside_its_own_argument():
    t = CommandTemplate.parse("run --tp={tp} --pp {pp} 'x {layout} y' --tag a{dp}b{cp}c")
    argv = t.render(values())
    assert argv == ["run", "--tp=2", "--pp", "2", "x dp2-tp2-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1 y",
                    "--tag", "a2b1c"]
    assert t.fields == {"tp", "pp", "layout", "dp", "cp"}


def test_every_documented_placeholder_has_a_value_or_an_exporter():
    plain = set(values())
    exporter = {"megatron_args", "megatron_script", "torchtitan_toml", "deepspeed_json"}
    assert set(PLACEHOLDERS) == plain | exporter


def test_literal_braces_and_quotes():
    argv = CommandTemplate.parse("""echo '{{"a": {tp}}}' "two words" """).render(values())
    assert argv == ["echo", '{"a": 2}', "two words"]


MALICIOUS = ["$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "a && touch PWNED", "x | sh",
             "'; rm -rf / #", '" --evil', "a b c", "$HOME", "\n--inject", "{tp}", "*", "> out"]


@pytest.mark.parametrize("bad", MALICIOUS)
def test_a_malicious_value_stays_one_literal_argument(bad):
    t = CommandTemplate.parse("prog --model {model} --name=pre{model}post {tp}")
    argv = t.render(values(model=bad))
    assert argv == ["prog", "--model", bad, f"--name=pre{bad}post", "2"]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_any_value_is_inserted_verbatim(text):
    t = CommandTemplate.parse("prog {model} x{study}y {tp}")
    argv = t.render(values(model=text, study=text))
    assert argv == ["prog", text, f"x{text}y", "2"]


def test_malicious_value_reaches_a_real_process_unchanged(tmp_path):
    """End to end through a real subprocess: the program sees the value as one argument and no
    shell ever runs it."""
    bad = f"$(touch {tmp_path}/PWNED1); touch {tmp_path}/PWNED2 && echo `touch {tmp_path}/PWNED3`"
    t = CommandTemplate.parse(f"{sys.executable} -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "
                              "{model} --x={model}")
    argv = t.render(values(model=bad))
    out = subprocess.run(argv, shell=False, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [bad, f"--x={bad}"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("text,needle", [
    ("run 'unbalanced", "cannot split into arguments"),
    ('run "unbalanced', "cannot split into arguments"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("run {nope}", "unknown placeholder {nope}"),
    ("run {TP}", "unknown placeholder {TP}"),
    ("run {}", "unknown placeholder {}"),
    ("run {tp.x}", "unknown placeholder {tp.x}"),
    ("run {tp", "literal braces"),
    ("run tp}", "literal braces"),
    ("run {tp!r}", "conversion or format spec"),
    ("run {tp:03d}", "conversion or format spec"),
    ("run --args={megatron_args}", "must stand alone"),
    ("bash -c 'train --tp {tp}'", "would be parsed by the shell"),
    ("/bin/sh -ec 'train {layout}'", "would be parsed by the shell"),
])
def test_bad_templates_are_refused_with_a_reason(text, needle):
    with pytest.raises(SpecError) as exc:
        CommandTemplate.parse(text)
    assert needle in str(exc.value)


def test_shell_with_placeholders_as_separate_arguments_is_allowed():
    t = CommandTemplate.parse("bash -c 'train \"$@\"' bash --tp {tp} {layout}")
    argv = t.render(values())
    assert argv[:3] == ["bash", "-c", 'train "$@"'] and argv[-3:] == ["--tp", "2", LAYOUT.slug]


def test_exporter_targets_are_known_from_the_template():
    t = CommandTemplate.parse("train {megatron_args} --cfg {deepspeed_json} --tt {torchtitan_toml}")
    assert t.exporter_targets == {"megatron", "deepspeed", "torchtitan"}
    assert CommandTemplate.parse("bash {megatron_script}").exporter_targets == {"megatron"}
    assert CommandTemplate.parse("train {tp}").exporter_targets == set()


HAVE_EXPORTERS = importlib.util.find_spec("autoparallel.exporters") is not None
needs_exporters = pytest.mark.skipif(not HAVE_EXPORTERS, reason="exporters not merged yet")


@needs_exporters
def test_megatron_args_splice_the_exporter_flags():
    from autoparallel.exporters import render

    script = render("megatron", PROBLEM, LAYOUT)
    t = CommandTemplate.parse("python fake.py --layout {layout} {megatron_args} --extra")
    exported, env = render_exports(t, PROBLEM, LAYOUT, None)
    argv = t.render(values() | exported)
    flags = argv[4:-1]
    assert argv[:4] == ["python", "fake.py", "--layout", LAYOUT.slug] and argv[-1] == "--extra"
    assert flags[flags.index("--tensor-model-parallel-size") + 1] == "2"
    assert flags[flags.index("--pipeline-model-parallel-size") + 1] == "2"
    assert "--sequence-parallel" in flags and "$@" not in flags
    # every flag comes from the script's command line, in order, and nothing from its comments
    joined = " ".join(flags)
    assert joined in " ".join(script.replace("\\\n", " ").split())
    assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == ("1" if "CUDA_DEVICE_MAX_CONNECTIONS=1" in script
                                                     else None)


@needs_exporters
def test_megatron_script_is_a_file_holding_the_rendering(tmp_path):
    from autoparallel.exporters import render

    t = CommandTemplate.parse("bash {megatron_script} --data-path /data")
    exported, _ = render_exports(t, PROBLEM, LAYOUT, tmp_path)
    argv = t.render(values() | exported)
    assert argv == ["bash", str(tmp_path / "megatron.sh"), "--data-path", "/data"]
    assert Path(argv[1]).read_text() == render("megatron", PROBLEM, LAYOUT)


@needs_exporters
def test_torchtitan_toml_is_a_file_holding_the_rendering(tmp_path):
    from autoparallel.exporters import render

    t = CommandTemplate.parse("train --job.config_file {torchtitan_toml}")
    exported, _ = render_exports(t, PROBLEM, LAYOUT, tmp_path)
    argv = t.render(values() | exported)
    assert argv[-1] == str(tmp_path / "torchtitan.toml")
    assert Path(argv[-1]).read_text() == render("torchtitan", PROBLEM, LAYOUT, "0.2.2")


@needs_exporters
def test_deepspeed_json_is_a_file_holding_the_rendering(tmp_path):
    from autoparallel.exporters import render

    dp_only = Layout(zero=3, micro_batch=1).resolved(8)  # DeepSpeed's JSON: DP + ZeRO only
    t = CommandTemplate.parse("deepspeed train.py --deepspeed_config {deepspeed_json}")
    exported, _ = render_exports(t, PROBLEM, dp_only, tmp_path)
    argv = t.render(values() | exported)
    assert argv[-1] == str(tmp_path / "deepspeed.json")
    assert Path(argv[-1]).read_text() == render("deepspeed", PROBLEM, dp_only)
    json.loads(Path(argv[-1]).read_text())


@needs_exporters
def test_a_layout_the_launcher_cannot_express_is_an_export_error():
    from autoparallel.errors import ExportError

    t = CommandTemplate.parse("deepspeed train.py --deepspeed_config {deepspeed_json}")
    with pytest.raises(ExportError, match="deepspeed cannot launch"):
        render_exports(t, PROBLEM, LAYOUT, None)


def test_exporter_placeholders_without_exporters_are_a_clear_error(monkeypatch):
    import autoparallel.tune.command as command

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr(command.importlib, "import_module", missing)
    t = CommandTemplate.parse("train {megatron_args}")
    with pytest.raises(SpecError, match="need autoparallel.exporters"):
        render_exports(t, PROBLEM, LAYOUT, None)

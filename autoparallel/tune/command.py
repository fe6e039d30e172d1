"""The `--measure` command template: parsed once, rendered per layout into an argument list.

Safety model: the template is split into arguments with `shlex.split` *before* anything is
substituted; each placeholder is then replaced inside its own argument, and the result is run
with `shell=False`. A substituted value can therefore never become shell syntax, a second
argument or a second command, whatever characters it holds. The one exception the user can
create — a placeholder inside the script of `sh -c '...'` — is refused at parse time.

Placeholders (see `PLACEHOLDERS`): layout axes (`{tp}`, `{pp}`, ...), job facts (`{n_gpus}`,
`{seq_len}`, ...), bookkeeping (`{trial}`, `{trial_dir}`, `{layout}`), launcher renderings from
`autoparallel.exporters.render` (`{megatron_args}` expands to several arguments and must stand
alone; `{megatron_script}`, `{torchtitan_toml}` and `{deepspeed_json}` are paths of files written
for the trial). Write `{{` and `}}` for literal braces.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExportError, SpecError
from ..specs.layout import Layout
from ..specs.problem import Problem

PLACEHOLDERS: dict[str, str] = {
    "layout": "layout slug, e.g. dp8-tp2-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1",
    "dp": "data-parallel degree", "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree", "vp": "virtual pipeline stages per rank",
    "cp": "context-parallel degree",
    "cp_comm": "context-parallel form: ring, a2a, allgather or a2a+ring (ring when cp = 1)",
    "cp_a2a": "all-to-all group of the a2a+ring form (1 otherwise)",
    "ep": "expert-parallel degree",
    "etp": "expert tensor-parallel degree (tp unless folded)", "edp": "expert data-parallel degree",
    "zero": "ZeRO stage 0-3",
    "recompute": "none, selective or full", "sp": "sequence parallelism, 1 or 0",
    "micro_batch": "sequences per micro-batch", "grad_accum": "micro-batches per step",
    "n_gpus": "GPUs in the job", "gpus_per_node": "GPUs per node", "n_nodes": "nodes in the job",
    "seq_len": "tokens per sequence", "global_batch": "sequences per step",
    "model": "model name", "gpu": "GPU preset name",
    "trial": "Optuna trial number", "study": "Optuna study name",
    "trial_dir": "a directory for this trial (holds output.log and rendered configs)",
    "megatron_args": "Megatron-LM flags of the layout (what the exporter puts after "
                     "pretrain_gpt.py); several arguments, stands alone",
    "megatron_script": "path of the Megatron launch script written for the trial (run it with "
                       "bash; extra arguments reach pretrain_gpt.py)",
    "torchtitan_toml": "path of a torchtitan TOML written for the trial",
    "deepspeed_json": "path of a DeepSpeed JSON written for the trial",
}
"""Every placeholder `--measure` may use, with what it becomes."""

SPLICED = {"megatron_args": "megatron"}
"""Placeholders that expand to several arguments (exporter target each needs)."""
FILES = {"megatron_script": ("megatron", "megatron.sh"),
         "torchtitan_toml": ("torchtitan", "torchtitan.toml"),
         "deepspeed_json": ("deepspeed", "deepspeed.json")}
"""Placeholders that become a file path (exporter target, file name)."""
FILE_FORMS = {"torchtitan": {"version": "0.2.2"}}
"""Exporter options that give each file placeholder its form ({torchtitan_toml}: the TOML)."""
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh"}


def _fields(token: str) -> list[tuple[str, str | None]]:
    """(literal, field) pieces of one argument; raises ValueError on malformed braces."""
    pieces = []
    for literal, field, spec, conv in string.Formatter().parse(token):
        if field is not None and (spec or conv):
            raise ValueError(f"placeholder {{{field}{'!' + conv if conv else ''}"
                             f"{':' + spec if spec else ''}}} has a conversion or format spec; "
                             "write the bare name, e.g. {tp}")
        pieces.append((literal, field))
    return pieces


@dataclass(frozen=True)
class CommandTemplate:
    """A parsed `--measure` template: its arguments and the placeholders they use."""

    text: str
    tokens: tuple[str, ...]
    fields: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> CommandTemplate:
        """Split `text` like a POSIX shell and check every placeholder.

        Raises:
            SpecError: unbalanced quotes, malformed or unknown placeholders, a spliced
                placeholder inside a longer argument, or placeholders inside an `sh -c` script.
        """
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            raise SpecError(f"`--measure` {text!r}: cannot split into arguments ({exc})") from None
        if not tokens:
            raise SpecError("`--measure` is empty: give the command that runs a short "
                            "training job")
        fields: set[str] = set()
        for tok in tokens:
            try:
                pieces = _fields(tok)
            except ValueError as exc:
                raise SpecError(f"`--measure` argument {tok!r}: {exc} (write {{{{ and }}}} for "
                                "literal braces)") from None
            names = [f for _, f in pieces if f is not None]
            for name in names:
                if name not in PLACEHOLDERS:
                    raise SpecError(f"`--measure`: unknown placeholder {{{name}}}; known: "
                                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
                if name in SPLICED and tok != f"{{{name}}}":
                    raise SpecError(f"`--measure`: {{{name}}} expands to several arguments and "
                                    f"must stand alone, not inside {tok!r}")
            fields.update(names)
        _refuse_shell_scripts(tokens)
        return cls(text=text, tokens=tuple(tokens), fields=frozenset(fields))

    @property
    def exporter_targets(self) -> set[str]:
        """Launcher targets (`megatron`, `torchtitan`, `deepspeed`) the template needs."""
        return ({SPLICED[f] for f in self.fields if f in SPLICED}
                | {FILES[f][0] for f in self.fields if f in FILES})

    def render(self, values: Mapping[str, str | list[str]]) -> list[str]:
        """The argument list for one trial. Each value is inserted verbatim into the argument
        that holds its placeholder; list values (spliced placeholders) become several
        arguments. Nothing is ever re-split or interpreted."""
        argv: list[str] = []
        for tok in self.tokens:
            pieces = _fields(tok)
            if len(pieces) == 1 and pieces[0][0] == "" and pieces[0][1] in SPLICED:
                argv.extend(str(v) for v in values[pieces[0][1]])
                continue
            argv.append("".join(lit + ("" if f is None else str(values[f])) for lit, f in pieces))
        return argv


def _refuse_shell_scripts(tokens: list[str]) -> None:
    """Refuse `sh -c '... {tp} ...'`: there the shell, not autoparallel, would parse the value."""
    for i, tok in enumerate(tokens[:-2]):
        if os.path.basename(tok) not in SHELLS:
            continue
        j = i + 1
        while j < len(tokens) and tokens[j].startswith("-"):
            if re.fullmatch(r"-[A-Za-z]*c[A-Za-z]*", tokens[j]):
                script = tokens[j + 1] if j + 1 < len(tokens) else ""
                if any(f for _, f in _fields(script)):
                    raise SpecError(
                        f"`--measure`: placeholders inside the {tok} -c script {script!r} "
                        "would be parsed by the shell; pass them as separate arguments instead, "
                        f"e.g. {tok} -c 'train \"$@\"' {tok} {{megatron_args}}")
                break
            j += 1


def exporters_module():
    """`autoparallel.exporters`, or a SpecError saying it is not part of this build."""
    try:
        return importlib.import_module("autoparallel.exporters")
    except ModuleNotFoundError as exc:
        if exc.name not in ("autoparallel.exporters", "autoparallel"):
            raise
        raise SpecError("the launcher placeholders ({megatron_args}, {megatron_script}, "
                        "{torchtitan_toml}, {deepspeed_json}) need autoparallel.exporters, which "
                        "this build does not have; use the layout placeholders ({tp}, {pp}, ...)"
                        ) from None


def megatron_split(script: str) -> tuple[list[str], dict[str, str]]:
    """From the Megatron exporter's launch script: the flags after the training script (`*.py`)
    and the environment its `export NAME=value` lines set.

    Raises:
        ExportError: no training-script line, or a flag that only a shell could expand.
    """
    env: dict[str, str] = {}
    flags: list[str] | None = None
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env |= dict(w.split("=", 1) for w in words[1:] if "=" in w)
            continue
        script_at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        if script_at is not None:
            flags = [w for w in words[script_at + 1:] if w != "$@"]
    if flags is None:
        raise ExportError("the megatron export has no training-script (*.py) line")
    for w in flags:
        if "$" in w:
            raise ExportError(f"the megatron flag {w!r} needs a shell to expand; use "
                              "{megatron_script} with bash instead of {megatron_args}")
    return flags, env


def layout_values(problem: Problem, layout: Layout, *, trial: int, study: str,
                  trial_dir: Path, grad_accum: int) -> dict[str, str]:
    """String values of the non-exporter placeholders for one trial."""
    c, tr = problem.cluster, problem.training
    lay = layout.resolved(c.n_gpus)
    return {
        "layout": lay.slug, "dp": str(lay.dp), "tp": str(lay.tp), "pp": str(lay.pp),
        "vp": str(lay.vp), "cp": str(lay.cp), "cp_comm": lay.cp_form.value,
        "cp_a2a": str(lay.cp_a2a or 1), "ep": str(lay.ep),
        "etp": str(lay.expert_tp), "edp": str(lay.edp), "zero": str(lay.zero),
        "recompute": lay.recompute.value, "sp": "1" if lay.sp else "0",
        "micro_batch": str(lay.micro_batch), "grad_accum": str(grad_accum),
        "n_gpus": str(c.n_gpus), "gpus_per_node": str(c.gpus_per_node),
        "n_nodes": str(max(1, -(-c.n_gpus // c.gpus_per_node))),
        "seq_len": str(tr.seq_len), "global_batch": str(tr.global_batch),
        "model": problem.model.name, "gpu": c.gpu.name,
        "trial": str(trial), "study": study, "trial_dir": str(trial_dir),
    }


def render_exports(template: CommandTemplate, problem: Problem, layout: Layout,
                   trial_dir: Path | None) -> tuple[dict[str, str | list[str]], dict[str, str]]:
    """(placeholder values, environment) of the exporter placeholders the template uses. Files
    are written into `trial_dir` (nothing is written when it is None: a dry run to check that
    the layout can be expressed). The environment holds what the Megatron script exports (e.g.
    CUDA_DEVICE_MAX_CONNECTIONS=1) when `{megatron_args}` is used without the script.

    Raises:
        ExportError: a target cannot express the layout.
        SpecError: `autoparallel.exporters` is missing.
    """
    targets = template.exporter_targets
    if not targets:
        return {}, {}
    render = exporters_module().render
    out: dict[str, str | list[str]] = {}
    env: dict[str, str] = {}
    texts = {t: render(t, problem, layout, **FILE_FORMS.get(t, {})) for t in sorted(targets)}
    if "megatron_args" in template.fields:
        out["megatron_args"], env = megatron_split(texts["megatron"])
    for name, (target, filename) in FILES.items():
        if name in template.fields:
            path = (trial_dir or Path(".")) / filename
            if trial_dir is not None:
                path.write_text(texts[target], encoding="utf-8")
                if filename.endswith(".sh"):
                    path.chmod(0o755)
            out[name] = str(path)
    return out, env

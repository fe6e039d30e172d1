"""`autoparallel estimate`: memory and time of one layout (or of every row of a CSV)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import SpecError
from ..output.files import strict_json, write_whole
from . import command
from .options import (LAYOUT, OUTPUT, Fmt, FormatOpt, ProblemOptions, layout_options_class,
                      with_options)
from .outputs import check_output


@command("estimate")
@with_options(problem=ProblemOptions, layout=layout_options_class)
def estimate_command(
    problem: ProblemOptions,
    layout,
    fmt: FormatOpt = Fmt.table,
    input: Annotated[Optional[str], typer.Option("--input", help="Batch mode: a CSV of layouts to score (one problem per row; job flags such as --precision apply to the rows that leave them blank).", rich_help_panel=OUTPUT, metavar="CSV", show_default=False)] = None,
    output: Annotated[Optional[str], typer.Option("--output", help="Batch mode: the CSV to write (default: stdout).", rich_help_panel=OUTPUT, metavar="FILE", show_default=False)] = None,
    allow_tp_across_nodes: Annotated[bool, typer.Option("--allow-tp-across-nodes", help="Let TP groups span nodes (priced on the network), as plan's flag does.", rich_help_panel=LAYOUT)] = False,
) -> None:
    """Memory per GPU and time per step of one layout, each as a breakdown."""
    from ..rules import active_rules

    check_output("--output", output)
    # the TP-domain refusal names this flag (`evaluate._layout_error`), on every command
    rules = active_rules(disabled=["tp_in_node"] if allow_tp_across_nodes else [])
    if input is not None:
        from rich.console import Console

        from ..batch import read_layouts_csv, score_frame

        if layout.flags():
            raise SpecError(f"--input takes each row's layout from the CSV; drop "
                            f"{', '.join(layout.flags())}")
        given = problem.given() + (["--gpus-per-node"] if problem.gpus_per_node is not None else [])
        if given:
            raise SpecError(f"--input takes each row's problem from the CSV (columns model, gpu, "
                            f"n_gpus, gpus_per_node, seq_len, global_batch); drop "
                            f"{', '.join(given)}. Job settings (--precision, --stack, ...) "
                            "apply to every row whose own cell is blank")
        if fmt == Fmt.json:
            raise SpecError("--input writes CSV (to --output FILE or stdout); --format json is "
                            "for one layout")
        frame = read_layouts_csv(input)
        if not len(frame):
            typer.echo(f"note: --input {input} has a header and no rows: nothing to score",
                       err=True)
        scored = score_frame(frame, rules=rules, job=problem.job())
        if output:
            write_whole("--output", output, scored.to_csv(index=False))
            bad = int((scored["error"] != "").sum())
            Console(stderr=True).print(
                f"scored {len(scored) - bad} of {len(scored)} rows -> {output}"
                + (f" ({bad} with an error; see the `error` column)" if bad else "")
            )
        else:
            typer.echo(scored.to_csv(index=False), nl=False)
        return
    if fmt == Fmt.csv:
        raise SpecError("`--format csv` is for batch mode (--input); use table or json")
    if output is not None:
        raise SpecError("--output is for batch mode (--input); the estimate of one layout goes "
                        "to stdout (redirect it, e.g. > estimate.json)")
    lay = layout.layout()
    problem.check()
    built = problem.build()
    from ..evaluate import estimate

    rec = estimate(built, lay, rules=rules)
    for note in rec["notes"]:
        typer.echo(f"note: {note}", err=True)
    if fmt == Fmt.json:
        typer.echo(strict_json(rec))
    else:
        from .render import print_estimate

        print_estimate(rec)

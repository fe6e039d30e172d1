"""Pareto fronts for `plan --objective time,memory|time,gpus`."""

from __future__ import annotations


import typer

from ..output.files import strict_json
from ..errors import InfeasibleError
from ..problem import with_gpu_count
from ..search.explain import nothing_fits_message
from ..search.pareto import add_front_to_study, time_gpus_front, time_memory_front
from .options import Fmt
from .render import layout_slug, make_console, ranked_table


def run_pareto(problem, space, rules, second, top, fmt, storage, study_name) -> None:
    if second == "memory":
        front, res = time_memory_front(problem, space, rules)
        if not front.points:
            raise InfeasibleError(nothing_fits_message(res))
    else:
        def make_for(n):
            return with_gpu_count(problem, n)
        front = time_gpus_front(make_for, problem.cluster.n_gpus, problem.cluster.gpus_per_node,
                                space, rules)
        if not front.points:
            from ..search.next_steps import next_steps
            from ..search.plan import plan

            steps = next_steps(plan(problem, space, top=1, keep=0, rules=rules), rules)
            raise InfeasibleError("\n".join(
                [f"no GPU count up to {problem.cluster.n_gpus} fits {problem.model.name}"]
                + [f"next step: {s}" for s in steps]))
    if storage or study_name:
        add_front_to_study(front, storage, study_name)
    points = front.points[:top] if second == "gpus" else front.points
    if fmt == Fmt.json:
        typer.echo(strict_json({"objective": ["time", second], "pareto": points}))
        return
    if fmt == Fmt.csv:
        import pandas as pd

        rows = [{"rank": p["rank"], "n_gpus": p["n_gpus"], "layout": layout_slug(p),
                 "mem_total_gib": p["memory_gib"]["total"], "time_step_s": p["time_s"]["step"],
                 "mfu": p["mfu"], "tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"]} for p in points]
        typer.echo(pd.DataFrame(rows).to_csv(index=False), nl=False)
        return
    console = make_console()
    console.print(f"Pareto front of step time vs {second}: {len(front.points)} layouts")
    rows = [(str(p["rank"]), layout_slug(p),
             [("GPUs", str(p["n_gpus"])), ("mem GiB", f"{p['memory_gib']['total']:.1f}"),
              ("step s", f"{p['time_s']['step']:.3f}"), ("MFU", f"{p['mfu'] * 100:.1f}%")])
            for p in points]
    table = ranked_table(rows, console.width)
    console.print(table)

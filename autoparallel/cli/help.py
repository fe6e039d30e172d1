"""`--help` that reads at 80 and at 200 columns: options grouped in panels, names and values never
cut, help text printed as written (square brackets included).

An option's panel is the one its declaration names (`typer.Option(rich_help_panel=...)`: the
option groups of `cli.options` name theirs), else the command's own panel (`COMMANDS[...]
.panel`). Panels print Problem, Layout, Search, then the command's own panels in the order they
first appear, then Job, Output, and `Options` (`--help`) last. Each option is one entry: its
flags and value (`--tp LIST`, `--sp/--no-sp`) in a column as wide as the longest that fits a
third of the width and `MAX_NAME` (a longer one gets a line of its own), its help wrapped in the
rest.
"""

from __future__ import annotations

import textwrap

from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.main import get_command_from_info

PANEL_ORDER = ("Problem", "Layout", "Search", "Job", "Output")
"""Panels every command shares, first and in this order (`cli.options` declares them)."""
GENERAL = "Options"
"""The panel of `--help` (and of `--version`), printed last."""
MAX_NAME = 32
"""Widest name column; a longer name gets a line of its own, its help below it."""


def _metavar(param, ctx) -> str:
    """`LIST`, `INT`, `table|json|csv`, ... for an option taking a value; '' for a flag."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    if param.metavar:
        return param.metavar
    shown = (param.display_type(ctx) or "").strip("<>")
    return {"int": "INT", "str": "TEXT", "float": "FLOAT", "bool": "BOOL",
            "path": "PATH"}.get(shown, shown)


def option_names(param, ctx) -> str:
    """`--model TEXT`, `--sp/--no-sp`, `SWEEP_FILE` (an argument)."""
    if param.param_type_name == "argument":
        return param.metavar or param.name.upper()
    secondary = list(param.secondary_opts)
    if getattr(param, "is_flag", False) and param.default is False:
        secondary = []  # an off-by-default switch: its --no- form is implied
    flags = "/".join(list(param.opts) + secondary)
    mv = _metavar(param, ctx)
    return f"{flags} {mv}" if mv else flags


def _default(param) -> str:
    """` [default: 8]` (` [required]` for a required option), or '' when the default is not
    worth showing."""
    if param.required:
        return " [required]"
    show = getattr(param, "show_default", None)
    if isinstance(show, str):
        return f" [default: {show}]"
    if show is False or param.default is None:
        return ""
    if getattr(param, "is_flag", False):
        if param.secondary_opts and param.default is True:
            return f" [default: {param.opts[0]}]"
        return ""
    value = getattr(param.default, "value", param.default)
    if isinstance(value, float):
        value = f"{value:.6g}"
    return f" [default: {value}]"


def _panels(command, ctx) -> list[tuple[str, list]]:
    """(panel, params) in print order."""
    from . import COMMANDS

    entry = COMMANDS.get(command.name)
    own = entry.panel if entry else GENERAL
    groups: dict[str, list] = {}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if param.name in ("help", "version"):
            panel = GENERAL
        elif param.param_type_name == "argument":
            panel = "Arguments"
        else:
            panel = getattr(param, "rich_help_panel", None) or own
        groups.setdefault(panel, []).append(param)
    shared = ["Arguments", *PANEL_ORDER]
    own_panels = [p for p in groups if p not in shared and p != GENERAL]
    head, tail = shared[:4], shared[4:]  # Arguments, Problem, Layout, Search | Job, Output
    order = ([p for p in head if p in groups] + own_panels + [p for p in tail if p in groups]
             + ([GENERAL] if GENERAL in groups else []))
    return [(p, groups[p]) for p in order]


def name_column(names, width: int) -> int:
    """Width of the name column: the longest name within a third of `width` and `MAX_NAME`."""
    limit = max(12, min(width // 3, MAX_NAME))
    return max([len(n) for n in names if len(n) <= limit], default=12)


def entry_lines(rows: list[tuple[str, str]], width: int, indent: int = 2,
                col: int | None = None) -> list[tuple[str, str]]:
    """Two-column entries as (name, text) line pairs: names up to `col` (default
    `name_column`) share a line with the start of their text, longer ones get a line of their
    own; the text wraps at `width` (a word longer than the room is broken, never cut off)."""
    col = name_column([n for n, _ in rows], width) if col is None else col
    room = width - indent - col - 2
    if room < 24:  # very narrow: every text on the lines below its name
        col, room = 0, width - indent - 4
    out: list[tuple[str, str]] = []
    for name, text in rows:
        lines = textwrap.wrap(text, room, break_on_hyphens=False) if text else []
        if col and len(name) <= col:
            out.append((" " * indent + name.ljust(col) + "  ", lines[0] if lines else ""))
            rest = lines[1:]
        else:
            out.append((" " * indent + name, ""))
            rest = lines
        pad = " " * (indent + col + 2) if col else " " * (indent + 4)
        out += [(pad, line) for line in rest]
    return out


def _print(console, lines: list[tuple[str, str]], name_style: str) -> None:
    from rich.text import Text

    for name, text in lines:
        line = Text(name, style=name_style if name.strip() else "")
        line.append(text)
        console.print(line, soft_wrap=True, highlight=False)


def _paragraphs(text: str, width: int) -> list[str]:
    out: list[str] = []
    for para in (text or "").strip().split("\n\n"):
        out += textwrap.wrap(" ".join(para.split()), width - 2, break_on_hyphens=False) + [""]
    return out


def print_command_help(command, ctx, console) -> None:
    """The whole `--help` of one command."""
    from rich.text import Text

    width = console.width
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    console.print(Text("Usage: ", style="bold") + Text(usage), soft_wrap=True)
    console.print()
    for line in _paragraphs(command.help or "", width):
        console.print(Text("  " + line if line else ""), soft_wrap=True)
    panels = [(panel, [(option_names(p, ctx), (p.help or "").strip() + _default(p))
                       for p in params]) for panel, params in _panels(command, ctx)]
    col = name_column([n for _, rows in panels for n, _ in rows], width)
    for panel, rows in panels:
        console.print(Text(f"{panel}:", style="bold"))
        _print(console, entry_lines(rows, width, col=col), "bold cyan")
        console.print()


def print_group_help(group, ctx, console) -> None:
    """`autoparallel --help`: usage, summary, every command with its one-line summary (from
    `COMMANDS`, without importing any command), the group's options."""
    from rich.text import Text

    from . import COMMANDS

    width = console.width
    console.print(Text("Usage: ", style="bold") + Text(f"{ctx.command_path} [OPTIONS] COMMAND "
                                                       "[ARGS]..."), soft_wrap=True)
    console.print()
    for line in _paragraphs(group.help or "", width):
        console.print(Text("  " + line if line else ""), soft_wrap=True)
    console.print(Text("Commands:", style="bold"))
    _print(console, entry_lines([(n, e.summary) for n, e in COMMANDS.items()], width),
           "bold cyan")
    console.print()
    console.print(Text(f"{GENERAL}:", style="bold"))
    rows = [(option_names(p, ctx), (p.help or "").strip()) for p in group.get_params(ctx)]
    _print(console, entry_lines(rows, width), "bold cyan")
    console.print()
    console.print(Text(f"  `{ctx.command_path} COMMAND --help` for a command's options."),
                  soft_wrap=True)


def _console():
    from .render import make_console

    return make_console()


class _Option(TyperOption):
    """A Typer option that builds its value converter only when it has a value: typer makes
    a pydantic TypeAdapter per option on first use, and most of a command's options are
    left out (None) in any one call. Same result as typer's (`coerce(None)` is None)."""

    def process_value(self, ctx, value):
        if (value is None and not self.required and self.callback is None
                and not (self.multiple or self.nargs == -1)):
            return None
        return super().process_value(ctx, value)


class HelpCommand(TyperCommand):
    """A Typer command whose `--help` is `print_command_help` (and whose unset options cost
    nothing to parse, `_Option`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperOption:
                param.__class__ = _Option

    def format_help(self, ctx, formatter) -> None:
        print_command_help(self, ctx, _console())


class LazyGroup(TyperGroup):
    """The `autoparallel` group: lists the commands of `cli.COMMANDS` and builds one only when
    it is invoked (or its help is asked for), importing its module then."""

    def list_commands(self, ctx) -> list[str]:
        from . import COMMANDS

        return list(COMMANDS) + [n for n in self.commands if n not in COMMANDS]

    def get_command(self, ctx, cmd_name: str):
        from . import COMMANDS, app, load_command

        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in COMMANDS:
            cmd = get_command_from_info(load_command(cmd_name),
                                        pretty_exceptions_short=app.pretty_exceptions_short,
                                        rich_markup_mode=app.rich_markup_mode)
            self.commands[cmd_name] = cmd
        return cmd

    def resolve_command(self, ctx, args):
        names = self.list_commands(ctx)
        if args and args[0] not in names and not args[0].startswith("-"):
            from difflib import get_close_matches

            matches = get_close_matches(args[0], names)
            hint = (" Did you mean " + ", ".join(repr(m) for m in matches) + "?") if matches else ""
            ctx.fail(f"No such command {args[0]!r}.{hint}")
        return super().resolve_command(ctx, args)

    def format_help(self, ctx, formatter) -> None:
        print_group_help(self, ctx, _console())

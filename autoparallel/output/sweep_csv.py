"""The sweep CSV on disk: recognised before it is touched, verified problem by problem on
resume, appended one whole problem at a time, and never left half-written by an error.

File format: the header line `SWEEP_COLUMNS`, then one block of rows per problem. Every row is
one line. A block is `problem_rows` rows with `rank` 1..problem_rows (or one 'nothing fits' row
with an empty rank), so a block can be checked without recomputing it.

Resume (`read_existing`):
- an empty file, or a file holding only the beginning of our header (a cut), starts afresh;
- a first line that is not our header (another file, another schema version) is refused, and
  the file is left untouched;
- a last line without its line break (a kill, a full disk, a copy that stopped) is cut off;
- a block with fewer rows than its `problem_rows` says (a cut at a line break) is dropped and
  recomputed, and so is a second copy of a problem already present;
- any other malformed line is refused as corruption (nothing is modified).
When only the tail is dropped the file is truncated; when a block inside the file is dropped,
the kept blocks are rewritten to a temporary file that replaces the output (rename), so a crash
at any moment leaves either the old or the new file.

Settings (`check_settings`): what the rows depend on beyond each row's problem columns (layouts
kept per problem, target, active rules, search space) is kept in `<output>.settings.json`, written
when the first rows are; a resume with other settings is refused, since its rows would mix with
rows of another search under one header (a file without it, from before, is resumed as it is).

Writing (`SweepWriter`): each block is written with one `write` and flushed to the disk
(`fsync`); after a failed write the file is truncated back to its last whole block, so an error
never leaves a partial block, and a file that this run created and could not even give a
header is removed.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OutputError
from .files import fsync_dir, output_error, temp_name, write_all
from .frames import PROBLEM_COLUMNS, SWEEP_COLUMNS, SWEEP_SCHEMA_VERSION

HEADER = (",".join(SWEEP_COLUMNS) + "\n").encode()
_N_KEY = len(PROBLEM_COLUMNS)
_RANK = SWEEP_COLUMNS.index("rank")
_ROWS = SWEEP_COLUMNS.index("problem_rows")


def problem_key(values) -> tuple[str, ...]:
    """A problem's identity as the CSV spells it (None is an empty cell)."""
    return tuple("" if v is None else str(v) for v in values)


@dataclass
class Existing:
    """What an output file holds, as `read_existing` found it."""

    path: Path
    size: int = 0
    """Bytes in the file now."""
    header: bool = False
    """The file starts with our complete header (else it is new, empty or a cut header)."""
    blocks: list[tuple[tuple[str, ...], int, int]] = field(default_factory=list)
    """Kept blocks: (problem key, start byte, end byte), in file order."""
    dropped_partial: int = 0
    """Problems whose rows were not all present (recomputed)."""
    dropped_duplicate: int = 0
    """Second copies of a problem already present."""
    cut_bytes: int = 0
    """Bytes of a last line without its line break."""

    @property
    def done(self) -> set[tuple[str, ...]]:
        return {k for k, _, _ in self.blocks}

    @property
    def end(self) -> int:
        """Where appending starts once the dropped parts are gone."""
        return self.blocks[-1][2] if self.blocks else (len(HEADER) if self.header else 0)

    @property
    def in_place(self) -> bool:
        """The kept content is a prefix of the file (truncating is enough)."""
        pos = len(HEADER) if self.header else 0
        for _, start, end in self.blocks:
            if start != pos:
                return False
            pos = end
        return True

    def summary(self) -> str:
        """What resume found, for the command's last line ('' when nothing was dropped)."""
        parts = []
        if self.dropped_partial:
            parts.append(f"{self.dropped_partial} problem(s) with missing rows dropped and "
                         "recomputed")
        if self.dropped_duplicate:
            parts.append(f"{self.dropped_duplicate} duplicate problem block(s) removed")
        if self.cut_bytes:
            parts.append(f"a cut last line ({self.cut_bytes} bytes) removed")
        return "; ".join(parts)


def _refuse(path: Path, flag: str, why: str) -> OutputError:
    return OutputError(f"`{flag}` {path}: {why}; the file was not modified. Write to another "
                       "file, or move this one away to start afresh")


SETTINGS_SUFFIX = ".settings.json"
"""The settings file beside a sweep CSV (`check_settings`)."""


def settings_path(path: Path) -> Path:
    """`<output>.settings.json`."""
    return path.with_name(path.name + SETTINGS_SUFFIX)


def check_settings(existing: Existing, path: Path, want: dict, flag: str = "--output") -> None:
    """Refuse (`OutputError`) to add rows planned with settings `want` to a file whose rows were
    planned with others (its settings file says which); with no rows yet, record `want`."""
    import json

    from .files import write_whole

    side = settings_path(path)
    if not existing.blocks:
        write_whole(flag, side, json.dumps(want, indent=1, sort_keys=True) + "\n")
        return
    if not side.exists():
        return  # written before settings were recorded: nothing to compare
    try:
        have = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _refuse(path, flag, f"its settings file {side} cannot be read ({exc})") from None
    diff = [k for k in want if have.get(k) != want[k]]
    if diff:
        said = "; ".join(_difference(k, have.get(k), want[k]) for k in diff)
        raise _refuse(path, flag, f"its rows were planned with other settings ({said}), and "
                      "rows of two searches would mix")


def _difference(key: str, have, want) -> str:
    """'top 1 there, 5 now'; of lists, what one holds and the other not ('rules tp_in_node
    there, not now'); of tables, the entries that differ ('space tp [2] there, [2, 4] now')."""
    if isinstance(have, list) and isinstance(want, list):
        gone = [x for x in have if x not in want]
        new = [x for x in want if x not in have]
        parts = ([f"{', '.join(map(str, gone))} there, not now"] if gone else []) + \
            ([f"{', '.join(map(str, new))} now, not there"] if new else [])
        return f"{key} {'; '.join(parts)}"
    if isinstance(have, dict) and isinstance(want, dict):
        keys = [k for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k)]
        return "; ".join(f"{key} {k} {have.get(k)!r} there, {want.get(k)!r} now" for k in keys)
    return f"{key} {have!r} there, {want!r} now"


def read_all(fd: int, path: Path, flag: str = "--output") -> bytes:
    """Every byte of the file open as `fd`, from its start."""
    chunks, pos = [], 0
    try:
        while True:
            chunk = os.pread(fd, 1 << 20, pos)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            pos += len(chunk)
    except OSError as exc:
        raise output_error(flag, path, exc, "cannot read") from None


def read_existing(raw: bytes, path: Path, flag: str = "--output") -> Existing:
    """Recognise and verify the content `raw` of an existing sweep CSV (see the module
    docstring); raise `OutputError` for a file that is not ours or is corrupt (nothing is
    modified here)."""
    out = Existing(path)
    out.size = len(raw)
    if not raw:
        return out
    first_end = raw.find(b"\n")
    if first_end < 0:  # one line without a line break: the beginning of our header, or not ours
        if HEADER.startswith(raw):
            return out
        raise _refuse(path, flag, f"not a sweep CSV (it starts {_show(raw)})")
    if raw[: first_end + 1] != HEADER:
        first = raw[:first_end]
        # a sweep's header ranks its rows; an estimate's (`--input` output) has no rank
        if first.startswith(b"model,gpu,n_gpus,") and {b"rank", b"problem_rows"} & set(
                first.split(b",")):
            why = (f"a sweep CSV of another schema version (this version writes schema "
                   f"{SWEEP_SCHEMA_VERSION}, {len(SWEEP_COLUMNS)} columns; its header has "
                   f"{first.count(b',') + 1})")
        else:
            why = f"not a sweep CSV (its first line is {_show(first)})"
        raise _refuse(path, flag, why)
    out.header = True
    body_end = raw.rfind(b"\n") + 1
    out.cut_bytes = len(raw) - body_end
    pos, line_no = len(HEADER), 1
    rows: list[tuple[list[str], int, int]] = []
    while pos < body_end:
        nl = raw.index(b"\n", pos)
        line_no += 1
        try:
            text = raw[pos:nl].decode("utf-8")
            parsed = list(csv.reader([text]))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise _refuse(path, flag, f"line {line_no} is corrupt ({exc})") from None
        if len(parsed) != 1 or len(parsed[0]) != len(SWEEP_COLUMNS):
            got = len(parsed[0]) if len(parsed) == 1 else 0
            raise _refuse(path, flag, f"line {line_no} is corrupt ({got} fields, expected "
                          f"{len(SWEEP_COLUMNS)})")
        rows.append((parsed[0], pos, nl + 1))
        pos = nl + 1
    _blocks(out, rows)
    return out


def _blocks(out: Existing, rows: list[tuple[list[str], int, int]]) -> None:
    """Group rows into problem blocks; keep the complete first copy of each problem."""
    seen: set[tuple[str, ...]] = set()
    i = 0
    while i < len(rows):
        fields, start, _ = rows[i]
        key = tuple(fields[:_N_KEY])
        want = _int(fields[_ROWS])
        j = i + 1
        expect = 2
        while (j < len(rows) and tuple(rows[j][0][:_N_KEY]) == key
               and rows[j][0][_RANK] == str(expect)):
            j += 1
            expect += 1
        ranks = [rows[k][0][_RANK] for k in range(i, j)]
        wants = {rows[k][0][_ROWS] for k in range(i, j)}
        whole = (want is not None and len(wants) == 1 and j - i == want
                 and (ranks == [str(r) for r in range(1, want + 1)]
                      or (want == 1 and ranks == [""])))
        if not whole:
            out.dropped_partial += 1
        elif key in seen:
            out.dropped_duplicate += 1
        else:
            seen.add(key)
            out.blocks.append((key, start, rows[j - 1][2]))
        i = j


def _int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


def _show(raw: bytes, n: int = 40) -> str:
    text = raw[:n].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(raw) > n else ""))


class _FdWriter:
    """A sweep writer's file descriptor, closed once; a failing close is an `OutputError`
    naming the flag and the path."""

    fd: int | None
    path: Path
    flag: str

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.close(fd)
            except OSError as exc:
                raise output_error(self.flag, self.path, exc) from None


class SweepWriter(_FdWriter):
    """Appends whole problem blocks to the output open (and locked, `output.lock`) as `fd`
    (see the module docstring); `existing` is what `read_existing` found in it."""

    def __init__(self, fd: int, path: Path, existing: Existing, flag: str = "--output") -> None:
        self.fd, self.path, self.flag = fd, path, flag
        self.good = 0
        try:
            if existing.header and not existing.in_place:
                self._rewrite(existing)
            else:
                end = existing.end
                if existing.size != end:
                    os.ftruncate(fd, end)
                self.good = end
                if not existing.header:
                    self.write_block(HEADER)
                elif existing.size != end:
                    os.fsync(fd)
        except OSError as exc:
            self._undo()
            raise output_error(flag, path, exc) from None

    def _rewrite(self, ex: Existing) -> None:
        """Replace the file by its header and kept blocks: a temporary file, locked, renamed
        over it (a writer waiting for the old file's lock then locks the new one)."""
        from .lock import lock_fd

        raw = read_all(self.fd, self.path, self.flag)
        target = Path(os.path.realpath(self.path))  # through a symbolic link: its target
        tmp = temp_name(target, "new")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            lock_fd(fd)
            write_all(fd, HEADER + b"".join(raw[s:e] for _, s, e in ex.blocks))
            os.fsync(fd)
            os.replace(tmp, target)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fsync_dir(target)
        old, self.fd = self.fd, fd
        self.good = os.lseek(fd, 0, os.SEEK_END)
        os.close(old)

    def write_block(self, block: bytes) -> None:
        """Append one problem's rows (one write at the end of the last whole block, then
        fsync); on failure cut back to the last whole block and raise `OutputError`."""
        try:
            view, pos = memoryview(block), self.good
            while view:
                n = os.pwrite(self.fd, view, pos)
                view, pos = view[n:], pos + n
            os.fsync(self.fd)
        except OSError as exc:
            self._undo()
            raise output_error(self.flag, self.path, exc) from None
        self.good += len(block)

    def _undo(self) -> None:
        """After an error: back to the last whole block. A file left without even its header
        held nothing but our header's beginning: it is removed rather than left empty."""
        try:
            os.ftruncate(self.fd, self.good)
        except OSError:
            pass
        if self.good == 0:
            try:
                target = os.path.realpath(self.path)
                if os.fstat(self.fd).st_ino == os.stat(target).st_ino:
                    os.unlink(target)
            except OSError:
                pass


class StreamWriter(_FdWriter):
    """Writes a sweep to a stream (`/dev/stdout`, a pipe, a FIFO, /dev/null): the header, then
    each block; no resume, no fsync."""

    def __init__(self, fd: int, path: Path, flag: str = "--output") -> None:
        self.fd, self.path, self.flag = fd, path, flag
        self.write_block(HEADER)

    def write_block(self, block: bytes) -> None:
        try:
            write_all(self.fd, block)
        except OSError as exc:
            raise output_error(self.flag, self.path, exc) from None

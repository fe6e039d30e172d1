"""Reading a user's CSV (a what-if table, a runs file, a sweep to export): every cell as a
string, and one readable error naming the flag and the path when the file cannot be read."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .errors import SpecError


def read_csv_strings(path: str | Path, where: str) -> pd.DataFrame:
    """The CSV at `path` with every cell a string (empty cells ""); a SpecError starting with
    `where` (e.g. "--input table.csv") when the file is missing, unreadable or not a CSV."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise SpecError(f"{where}: file not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SpecError(f"{where}: not a readable CSV ({str(exc).strip()})") from None
    except OSError as exc:  # a directory, no permission, ...
        raise SpecError(f"{where}: cannot read ({exc.strerror or exc})") from None

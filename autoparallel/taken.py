"""`Taken`: the rows at an index of a mapping of equal-length arrays, each array taken when
first read. A plan reorders a million layouts' table and ledgers, of which the ranking and
the output read a few arrays: taking every one of them at once would copy (and page in)
gigabytes that are never read."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class Taken(Mapping):
    """The rows at `index` of every array of `source`, each taken when first read (and kept).
    Nested takes compose their indices onto the first source. A source that stores only some
    keys for every row (`evaluate.Ledger`: `holds(key)`, `of_rows(index)`) costs the others
    for the rows taken, not for all of its own."""

    __slots__ = ("_source", "_index", "_cache")

    def __init__(self, source: Mapping[str, np.ndarray], index):
        index = np.asarray(index)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        if isinstance(source, Taken):
            index, source = source._index[index], source._source
        self._source, self._index = source, index
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        got = self._cache.get(key)
        if got is None:
            source = self._source
            holds = getattr(source, "holds", None)
            if holds is not None and not holds(key):
                # not stored for every row of the source: cost these rows alone (every key)
                self._cache.update(source.of_rows(self._index))
                return self._cache[key]
            got = self._cache[key] = source[key][self._index]
        return got

    def at(self, key: str, i: int):
        """Element i of array `key`, without taking the whole array."""
        got = self._cache.get(key)
        return got[i] if got is not None else self._source[key][self._index[i]]

    def __iter__(self):
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    @property
    def n_rows(self) -> int:
        """Rows taken."""
        return len(self._index)

    def __reduce__(self):  # pickled (a sweep's worker processes) as the plain dict it stands for
        return dict, (dict(self.items()),)


__all__ = ["Taken"]

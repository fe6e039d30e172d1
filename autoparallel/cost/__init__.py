"""The cost model: pure numpy functions over a `LayoutTable` (one code path for 1 or 10^6 rows)."""

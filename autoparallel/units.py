"""Unit constants. Inside the package everything is bytes, seconds and FLOPs; these convert at the edges."""

GiB = 2**30
"""Bytes in a gibibyte (the unit of every `*_gib` output)."""
MiB = 2**20
"""Bytes in a mebibyte."""
GB = 1e9
TB = 1e12
TFLOPS = 1e12
US = 1e-6
MS = 1e-3

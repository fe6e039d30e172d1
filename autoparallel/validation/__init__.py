"""Validation against measured runs (`autoparallel validate`) and calibration of the efficiency
profile (`autoparallel calibrate`).

- `runs`: a CSV of published/measured runs -> `RunCase`s (problem + layout + measurement), with
  a counted reason for every row that cannot be used.
- `modelspec`: the architecture columns of a row -> `ModelSpec`.
- `conventions`: the FLOP conventions sources use, to turn a reported TFLOP/s or MFU back into
  a measured throughput.
- `report`: predictions, errors, per-source tables, worst rows, plot.
- `calibrate`: robust least-squares fit of `Profile` knobs, leave-one-source-out errors.
"""

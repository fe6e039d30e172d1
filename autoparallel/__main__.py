"""`python -m autoparallel` runs the command line."""

from .cli import run

run()

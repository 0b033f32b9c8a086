"""`python -m kroberta.evaluate`: runs `kroberta.cli.evaluate` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "evaluate")

"""`python -m kroberta.prepare`: runs `kroberta.cli.prepare` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "prepare")

"""`python -m kroberta.report`: runs `kroberta.cli.report` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "report")

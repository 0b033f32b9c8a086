"""`python -m kroberta.export`: runs `kroberta.cli.export` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "export")

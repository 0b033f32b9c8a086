"""`python -m kroberta.aot`: runs `kroberta.cli.aot` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "aot")

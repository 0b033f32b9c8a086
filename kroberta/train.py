"""`python -m kroberta.train`: runs `kroberta.cli.train` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "train")

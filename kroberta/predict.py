"""`python -m kroberta.predict`: runs `kroberta.cli.predict` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "predict")

"""`python -m kroberta.finetune`: runs `kroberta.cli.finetune` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

run_command(__name__, "finetune")

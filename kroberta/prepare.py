"""`python -m kroberta.prepare`: runs `kroberta.cli.prepare` (see `kroberta.cli.run_command`)."""

from kroberta.cli import run_command

# prepare's worker processes ("spawn") import the main module again as __mp_main__:
# there it must not run the command a second time.
if __name__ != "__mp_main__":
    run_command(__name__, "prepare")

"""`python -m kroberta.export`.

The command lives in `kroberta.cli.export`; this file keeps `python -m kroberta.export`
working, and is not a module to import.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.export is run as `python -m kroberta.export`; the command's module is "
                      "kroberta.cli.export")

from kroberta.cli.export import main  # noqa: E402

sys.exit(main())

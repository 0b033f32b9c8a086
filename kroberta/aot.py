"""`python -m kroberta.aot`.

The command lives in `kroberta.cli.aot`; this file keeps `python -m kroberta.aot`
working, and is not a module to import.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.aot is run as `python -m kroberta.aot`; the command's module is "
                      "kroberta.cli.aot")

from kroberta.cli.aot import main  # noqa: E402

sys.exit(main())

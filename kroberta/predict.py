"""`python -m kroberta.predict`.

The command lives in `kroberta.cli.predict`; this file keeps `python -m
kroberta.predict` working. It is not a module to import: `kroberta.predict` is the
Python API, `kroberta.predict(model, inputs, ...)`, and importing this file would put
the module in its place.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.predict is run as `python -m kroberta.predict`; the command's module is "
                      "kroberta.cli.predict; the Python API is kroberta.predict(model, inputs, ...)")

from kroberta.cli.predict import main  # noqa: E402

sys.exit(main())

"""`python -m kroberta.prepare`.

The command lives in `kroberta.cli.prepare`; this file keeps `python -m
kroberta.prepare` working. It is not a module to import: `kroberta.prepare` is the
Python API, `kroberta.prepare(inputs, out_dir, ...)`, and importing this file would put
the module in its place.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.prepare is run as `python -m kroberta.prepare`; the command's module is "
                      "kroberta.cli.prepare; the Python API is kroberta.prepare(inputs, out_dir, ...)")

from kroberta.cli.prepare import main  # noqa: E402

sys.exit(main())

"""`python -m kroberta.train`.

The command lives in `kroberta.cli.train`; this file keeps `python -m kroberta.train`
working. It is not a module to import: `kroberta.train` is the Python API,
`kroberta.train(config)`, and importing this file would put the module in its place.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.train is run as `python -m kroberta.train`; the command's module is "
                      "kroberta.cli.train; the Python API is kroberta.train(config)")

from kroberta.cli.train import main  # noqa: E402

sys.exit(main())

"""`python -m kroberta.report`.

The command lives in `kroberta.cli.report`; this file keeps `python -m kroberta.report`
working. It is not a module to import: `kroberta.report` is the Python API,
`kroberta.report(run_dir)`, and importing this file would put the module in its place.
"""

import sys

if __name__ != "__main__":
    raise ImportError("kroberta.report is run as `python -m kroberta.report`; the command's module is "
                      "kroberta.cli.report; the Python API is kroberta.report(run_dir)")

from kroberta.cli.report import main  # noqa: E402

sys.exit(main())

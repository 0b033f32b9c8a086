"""Predict from the command line, streaming to an .npz file with bounded host memory.

    python -m kroberta.predict --run runs/seed --data 'x/*.tfrecords' --output top_k --k 5 --out preds.npz

Each batch's reduced result is appended to one raw file per output array as soon
as it arrives; at the end the arrays are packed into the .npz (written under a
temporary name and renamed, so an interrupted run leaves no partial file).

The Python API is `kroberta.predict(...)` (see kroberta/inference/engine.py); this
module is also callable as that function, so `import kroberta.predict` cannot
shadow it.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time
import types
import warnings
import zipfile

import numpy as np

import kroberta
from kroberta import cli as cli_lib
from kroberta.inference import OUTPUTS
from kroberta.atomic import atomic_path

# The prediction engine (JAX, Keras, TensorFlow) is imported when it is used, so that
# `--help` and argument errors answer at once.


class _Progress:
    """examples done / total and examples per second, on stderr."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.done = total, enabled, 0
        self.live = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()

    def update(self, count, final=False):
        self.done += count
        if not self.enabled or not (self.live or final):
            return
        seconds = max(time.perf_counter() - self.start, 1e-9)
        total = f"/{self.total}" if self.total else ""
        # Redrawn in place on a terminal; a log file gets the final line alone.
        sys.stderr.write(("\r" if self.live else "")
                         + f"predict: {self.done}{total} examples, {self.done / seconds:,.0f}/s, "
                         f"{seconds:.1f}s" + ("\n" if final else ""))
        sys.stderr.flush()


def write_npz(chunks, out_path: str, progress: _Progress) -> dict:
    """Streams chunks (dicts of arrays, rows first) into `out_path` (.npz); returns shapes."""
    work = tempfile.mkdtemp(prefix=".kroberta-predict-", dir=os.path.dirname(os.path.abspath(out_path)))
    try:
        raw, meta = {}, {}
        for chunk in chunks:
            for name, array in chunk.items():
                if name not in raw:
                    raw[name] = open(os.path.join(work, name + ".raw"), "wb")
                    meta[name] = [array.dtype, array.shape[1:], 0]
                raw[name].write(np.ascontiguousarray(array).tobytes())
                meta[name][2] += len(array)
            progress.update(len(next(iter(chunk.values()))))
        progress.update(0, final=True)
        for handle in raw.values():
            handle.close()
        with atomic_path(out_path) as tmp, zipfile.ZipFile(tmp, "w", allowZip64=True) as archive:
            for name, (dtype, row_shape, rows) in meta.items():
                with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array_header_2_0(
                        entry, {"descr": np.lib.format.dtype_to_descr(dtype),
                                "fortran_order": False, "shape": (rows, *row_shape)})
                    with open(os.path.join(work, name + ".raw"), "rb") as source:
                        shutil.copyfileobj(source, entry, 16 * 2**20)
        return {name: (rows, *row_shape) for name, (_, row_shape, rows) in meta.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parser():
    p = argparse.ArgumentParser(prog="python -m kroberta.predict", description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="a training run directory (kroberta.load)")
    p.add_argument("--data", required=True, action="append",
                   help="TFRecord file or glob (repeatable)")
    p.add_argument("--output", default="top_k", choices=OUTPUTS)
    p.add_argument("--k", type=int, default=5, help="candidates per position for top_k")
    p.add_argument("--positions", default="masked", choices=("masked", "all"))
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step, all devices")
    p.add_argument("--slots", type=int, default=None, help="prediction slots per sequence")
    p.add_argument("--out", required=True, help="the .npz file to write")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return cli_lib.run(lambda: _main(args), interrupted="interrupted; nothing was written",
                       also=(FileNotFoundError,))


def _main(args) -> int:
    from kroberta.inference import engine as prediction
    from kroberta.inference.inputs import PredictInputError

    if not args.out.endswith(".npz"):
        raise PredictInputError(f"--out: {args.out!r} must end with .npz")
    model = kroberta.load(args.run)
    chunks = prediction.predict_batches(model, args.data, output=args.output, k=args.k,
                                        positions=args.positions, batch_size=args.batch_size,
                                        slots=args.slots)
    from kroberta.data.pipeline import inspect_files, resolve_files

    total = inspect_files(resolve_files(args.data, "--data"), "--data").records
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        shapes = write_npz(chunks, args.out, _Progress(total, not args.no_progress))
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    summary = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    print(f"wrote {args.out}: {summary}")
    return 0


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from kroberta.inference import engine as prediction

        return prediction.predict(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule

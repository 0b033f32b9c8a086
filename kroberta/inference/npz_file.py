"""Streaming prediction results into one .npz file with bounded host memory.

Each chunk's arrays are appended to one raw file per output array as soon as they
arrive; at the end the arrays are packed into the .npz (written under a temporary
name and renamed, so an interrupted run leaves no partial file). An `out_path` on a
URL (gs://, any fsspec filesystem: `kroberta.storage`) is packed locally, then
uploaded as one object.
"""

import contextlib
import os
import shutil
import tempfile
import zipfile

import numpy as np

from kroberta import storage


def write_npz(chunks, out_path: str, progress) -> dict:
    """Streams chunks (dicts of arrays, rows first) into `out_path` (.npz); returns shapes.
    `progress.add(rows)` is called after each chunk and `progress.close()` once at the
    end (`kroberta.console.Progress`)."""
    # Beside the output (one filesystem for the raw files and the archive), or for a
    # URL in the local temporary directory.
    beside = None if storage.is_url(out_path) else os.path.dirname(os.path.abspath(out_path))
    work = tempfile.mkdtemp(prefix=".kroberta-predict-", dir=beside)
    raw, meta = {}, {}
    try:
        with contextlib.ExitStack() as open_files:  # closed after a failed write too
            for chunk in chunks:
                for name, array in chunk.items():
                    if name not in raw:
                        path = os.path.join(work, name + ".raw")
                        raw[name] = open_files.enter_context(open(path, "wb"))
                        meta[name] = [array.dtype, array.shape[1:], 0]
                    raw[name].write(np.ascontiguousarray(array).tobytes())
                    meta[name][2] += len(array)
                progress.add(len(next(iter(chunk.values()))))
            progress.close()
        with (
            storage.staged_file(out_path) as tmp,
            zipfile.ZipFile(tmp, "w", allowZip64=True) as archive,
        ):
            for name, (dtype, row_shape, rows) in meta.items():
                with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                    np.lib.format.write_array_header_2_0(
                        entry,
                        {
                            "descr": np.lib.format.dtype_to_descr(dtype),
                            "fortran_order": False,
                            "shape": (rows, *row_shape),
                        },
                    )
                    with open(os.path.join(work, name + ".raw"), "rb") as source:
                        shutil.copyfileobj(source, entry, 16 * 2**20)
        return {name: (rows, *row_shape) for name, (_, row_shape, rows) in meta.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)

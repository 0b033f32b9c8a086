"""Training checkpoints: weights, optimizer state and step, written atomically.

Layout: run_dir/checkpoints/step_00001200/{state/, meta/, _CHECKPOINT_METADATA},
written by Orbax: `state` holds every model and optimizer variable (the step is the
optimizer's `iteration`), `meta` the variables' paths and shapes. Orbax writes into
`step_00001200.orbax-checkpoint-tmp-*` and renames it into place only when every
process has finished, so a process killed mid-write leaves either the previous
checkpoints or a stray temporary directory that is ignored (and cleaned) on the next
start; a half-written checkpoint is never loaded.

Training writes them asynchronously (`Writer`, Orbax's AsyncCheckpointer): the step
loop is blocked only while the state is copied to host memory; the files are
written and committed by a background thread, which the next checkpoint, the end of
the run, a SIGTERM and an exception wait for.

A run directory on a URL (gs://, any fsspec filesystem; `kroberta.storage`): Orbax
writes each checkpoint into a local temporary directory as above, then its files are
uploaded to run_dir/checkpoints/step_N/ with `_CHECKPOINT_METADATA` last (object
stores have no rename: that marker's presence is what makes a checkpoint complete);
restoring downloads one. Pruning removes the marker first. An upload killed midway
leaves a step directory without the marker, ignored and cleaned on the next start.

Multi-process and sharded ("fsdp"/"model") runs: every process calls `Writer.save` and
`restore` (they are collectives). On a shared directory (NFS, a GCS FUSE mount) each
process writes and reads only the shards its devices hold. On a URL no directory is
shared for Orbax's per-process writes: the state is gathered into every host's memory
(one copy of the weights and optimizer state, as numpy arrays, which Orbax writes from
its primary process only), so process 0's staging directory holds the whole
checkpoint; it uploads it as above while the others wait. Restoring, each process
downloads the checkpoint and reads the shards it holds. A checkpoint restores into any
mesh and any number of processes: the values are resharded to the running layout.
"""

import concurrent.futures
import functools
import hashlib
import os
import re
import shutil
import tempfile
import time

import numpy as np

from kroberta import storage
from kroberta.errors import StorageError
from kroberta.run_layout import CHECKPOINT_DIR

# Orbax is imported where it is used: it costs ~2 s and runs that never checkpoint
# (predict, export) do not need it.

COMMIT_FILE = "_CHECKPOINT_METADATA"  # Orbax's; written last, so it marks a complete checkpoint
_NAME = re.compile(r"^step_(\d{8})$")


GROUPS = ("model", "optimizer")  # the state's top-level entries, as `Writer.save` writes them


def _variables(model):
    return {"model": list(model.variables), "optimizer": list(model.optimizer.variables)}


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints as (step, path), oldest first."""
    root = storage.join(run_dir, CHECKPOINT_DIR)
    found = []
    for name in storage.listdir(root):
        match = _NAME.match(name)
        path = storage.join(root, name)
        if match and storage.isfile(storage.join(path, COMMIT_FILE)):
            found.append((int(match.group(1)), path))
    return sorted(found)


def estimated_bytes(model) -> int:
    """Size of one checkpoint: every model and optimizer variable."""
    return sum(
        int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
        for group in _variables(model).values()
        for v in group
    )


class Writer:
    """Writes a run's checkpoints one at a time, in the background when `asynchronous`.

    `save` returns once the state has been copied off the devices (Orbax's blocking
    phase); the files are written and committed by a background thread while
    training goes on. The next `save`, `wait` and `close` first wait for that commit,
    so at most one checkpoint is in flight, and the old checkpoints beyond `keep`
    are removed only after the new one is committed. A process killed mid-write
    leaves Orbax's temporary directory, never a loadable checkpoint.

    In a multi-process run every process makes the same calls (they are collectives).
    """

    def __init__(self, run_dir: str, keep: int, asynchronous: bool = True):
        # start-up: `train` reads this module before JAX loads
        import jax

        self.run_dir = run_dir
        self.keep = keep
        self.asynchronous = asynchronous
        self._root = storage.join(run_dir, CHECKPOINT_DIR)
        # A URL in a multi-process job: the state gathered, uploaded by process 0 alone.
        self._gathered = storage.is_url(run_dir) and jax.process_count() > 1
        self._uploads = not self._gathered or jax.process_index() == 0
        # A URL's checkpoints are written here first, then uploaded (module docstring).
        if self._gathered:
            # Orbax's barriers compare the path across processes: the same one on every host.
            name = hashlib.sha256(run_dir.encode()).hexdigest()[:16]
            self._staging = os.path.join(tempfile.gettempdir(), f"kroberta-checkpoint-{name}")
        else:
            self._staging = storage.staging_dir(run_dir, "checkpoint")
        self._upload = None  # asynchronous, on a URL: the future that commits and uploads
        # Made here, before the step loop: importing Orbax costs 2-10 s, which would
        # otherwise count as the first checkpoint's blocked time.
        self._checkpointer = _checkpointer(asynchronous=asynchronous)
        self._in_flight = None  # the step being written in the background, or None
        # A step never pruned, whatever its age (train.keep_best: the best checkpoint).
        self.protected_step = None

    def save(self, model, step: int, extra: dict | None = None) -> float:
        """Starts (or, synchronous, completes) the checkpoint at `step`.

        Returns the seconds the caller was blocked: waiting for the previous
        checkpoint's commit, copying the state to host memory and, when
        synchronous, writing it.
        """
        # start-up: see the note on Orbax at the top
        import orbax.checkpoint as ocp

        started = time.perf_counter()
        self.wait()
        if self._checkpointer is None:  # closed: a new one
            self._checkpointer = _checkpointer(asynchronous=self.asynchronous)
        if self._staging is not None:
            os.makedirs(self._staging, exist_ok=True)  # `close` removed it
        state, meta = _state_and_meta(model, step, extra)
        if self._gathered:
            # start-up: the mesh's module loads JAX and Keras
            from kroberta.parallel.distribute import to_host

            state = {
                group: [to_host(value) for value in values]  # a collective
                for group, values in state.items()
            }
        try:
            # Twice Orbax's variables and 256 KiB: it writes per-process files, then merges
            # them into a second copy before it commits (a checkpoint of the tiny model
            # took 0.5 MiB, more than 0.8 MiB while it was written).
            storage.check_room(
                self._written(step), 2 * estimated_bytes(model) + 2**18, "a checkpoint"
            )
            self._checkpointer.save(
                os.path.abspath(self._written(step)),
                force=True,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
                ),
            )
        except Exception as error:  # OSError, or Orbax/tensorstore's own wrappers of one
            self._failed(step, error)
        self._in_flight = step
        if self.asynchronous and self._staging is not None and self._uploads:
            # The upload follows the commit in the background too: the step loop goes on.
            self._upload = _background().submit(self._commit, step)
        if not self.asynchronous:
            self.wait()  # committed already: prunes the old ones
        return time.perf_counter() - started

    def wait(self) -> float:
        """Waits for the checkpoint in flight to commit; returns the seconds waited.

        Raises StorageError when its background write failed.
        """
        if self._in_flight is None:
            return 0.0
        started = time.perf_counter()
        step, self._in_flight = self._in_flight, None
        upload, self._upload = self._upload, None
        try:
            try:
                if upload is not None:
                    upload.result()
                else:
                    self._commit(step)
            except Exception as error:
                self._failed(step, error)
        finally:
            if self._gathered:
                # start-up: the mesh's module loads JAX and Keras
                from kroberta.parallel.distribute import barrier

                barrier(f"kroberta checkpoint {step} uploaded")
        self._prune()
        return time.perf_counter() - started

    def _written(self, step: int) -> str:
        """Where Orbax writes the checkpoint of `step`: its place, or the local staging one."""
        name = f"step_{step:08d}"
        return (
            os.path.join(self._staging, name) if self._staging else os.path.join(self._root, name)
        )

    def _commit(self, step: int):
        """Waits for Orbax's commit; on a URL, then uploads the checkpoint, marker last."""
        if self.asynchronous:
            self._checkpointer.wait_until_finished()
        if self._staging is not None and self._uploads:
            local = self._written(step)
            storage.put_tree(
                local,
                storage.join(self._root, os.path.basename(local)),
                last=COMMIT_FILE,
                remove=True,
            )

    def close(self):
        """Waits for the checkpoint in flight (see `wait`), then releases Orbax's threads."""
        try:
            self.wait()
        finally:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)

    def _prune(self):
        # start-up: `train` reads this module before JAX loads
        import jax

        if jax.process_index() == 0:  # after the commit's final barrier: the new one is complete
            for step, old in list_checkpoints(self.run_dir)[: -self.keep]:
                if step != self.protected_step:
                    remove(old)

    def _failed(self, step: int, error: Exception):
        clean_temporaries(self.run_dir)  # Orbax's step_*.orbax-checkpoint-tmp-* directory
        if self._staging is not None:
            shutil.rmtree(self._written(step), ignore_errors=True)
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        # tensorstore's wrapper of an OSError (a ValueError of several hundred characters)
        # ends with the system's error code.
        code = re.search(r"os_error_code='(\d+)'", reason)
        if code:
            reason = os.strerror(int(code.group(1)))
        free = storage.free_text(self._root)
        raise StorageError(
            f"could not write the checkpoint at step {step} in {self._root}: {reason}"
            + (f" ({free})" if free else "")
            + "; the previous checkpoints are intact"
        ) from error


def remove(path: str):
    """Removes a checkpoint: its marker first, so one removed halfway is never listed."""
    storage.remove(storage.join(path, COMMIT_FILE))
    storage.rmtree(path)


@functools.cache
def _background():
    """One thread for the uploads of URL checkpoints (one in flight at a time)."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kroberta-upload")


def _checkpointer(asynchronous: bool = False):
    # start-up: see the note on Orbax at the top
    import orbax.checkpoint as ocp

    handler = ocp.CompositeCheckpointHandler()
    return ocp.AsyncCheckpointer(handler) if asynchronous else ocp.Checkpointer(handler)


def _state_and_meta(model, step, extra):
    state, paths, shapes = {}, {}, {}
    for group, variables in _variables(model).items():
        for i, v in enumerate(variables):
            key = f"{group}/{i:05d}"
            state.setdefault(group, []).append(v.value)  # jax.Arrays, sharded or not
            paths[key], shapes[key] = v.path, list(v.shape)
    return state, {"step": step, "paths": paths, "shapes": shapes, **(extra or {})}


def _stable(path: str) -> str:
    """A variable path without Keras' process-wide counters.

    Dropout layers own seed generators named `seed_generator_<N>`, N counting every
    generator the process has made: a model rebuilt in the same process (a
    resume through the Python API) gets other numbers for the same variables.
    """
    return _SEED_GENERATOR.sub("seed_generator", path)


_SEED_GENERATOR = re.compile(r"seed_generator_\d+")


def restore(model, path: str, optimizer: bool = True) -> dict:
    """Loads a checkpoint written by `Writer.save` into a built model and optimizer; returns
    its meta. Without `optimizer`, only the model's weights, into an uncompiled
    `kroberta.MaskedLM` of the run's shape: nothing is compiled and no optimizer is built.

    Each value is restored straight into the sharding of the variable it replaces,
    so a checkpoint written on one mesh (or by N processes) loads into another.
    """
    # start-up: JAX and Orbax (see the note at the top)
    import jax
    import orbax.checkpoint as ocp

    groups = _variables(model) if optimizer else {"model": list(model.variables)}
    with (
        storage.local_copy(path) as local,
        _checkpointer() as checkpointer,
        storage.reading(path, "checkpoint"),
    ):
        local = os.path.abspath(local)
        meta = checkpointer.restore(local, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))[
            "meta"
        ]
        target = {}
        for group, variables in groups.items():
            _check_group(meta, group, variables, path)
            target[group] = [
                jax.ShapeDtypeStruct(v.value.shape, v.value.dtype, sharding=v.value.sharding)
                for v in variables
            ]
        _add_unasked_groups(target, ocp, local)
        state = checkpointer.restore(
            local, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        )["state"]
    for group, variables in groups.items():
        for v, value in zip(variables, state[group]):
            v.assign(value)
    return meta


def _add_unasked_groups(target: dict, ocp, path: str):
    """Orbax restores the state's whole tree: a group not asked for (the optimizer's, when
    only weights are loaded) is read as the files' own metadata describes it, onto this
    process's first device, then dropped."""
    if set(target) == set(GROUPS):
        return
    # start-up: JAX and Orbax (see the note at the top)
    import jax
    from etils import epath  # Orbax's path type

    saved = ocp.StandardCheckpointHandler().metadata(epath.Path(os.path.join(path, "state")))
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    for group in GROUPS:
        if group not in target:
            target[group] = [
                jax.ShapeDtypeStruct(tuple(entry.shape), entry.dtype, sharding=device)
                for entry in saved[group]
            ]


def _check_group(meta: dict, group: str, variables: list, named: str):
    """Raises ValueError unless the checkpoint's `group` variables are `variables`'s
    paths and shapes, in order."""
    keys = sorted(k for k in meta["paths"] if k.startswith(group + "/"))
    if len(keys) != len(variables):
        raise ValueError(
            f"{named}: holds {len(keys)} {group} variables, the model has {len(variables)}"
        )
    for key, v in zip(keys, variables):
        if _stable(meta["paths"][key]) != _stable(v.path) or tuple(meta["shapes"][key]) != tuple(
            v.shape
        ):
            raise ValueError(
                f"{named}: {key} is {meta['paths'][key]} {tuple(meta['shapes'][key])}, "
                f"the model expects {v.path} {tuple(v.shape)}"
            )


def clean_temporaries(run_dir: str):
    """Removes checkpoints left half-written by a killed process (on a URL: step
    directories whose upload never reached the marker)."""
    root = storage.join(run_dir, CHECKPOINT_DIR)
    url = storage.is_url(run_dir)
    for name in storage.listdir(root):
        path = storage.join(root, name)
        if (
            name.startswith(".tmp-")
            or ".orbax-checkpoint-tmp" in name
            or (url and _NAME.match(name) and not storage.isfile(storage.join(path, COMMIT_FILE)))
        ):
            storage.rmtree(path)

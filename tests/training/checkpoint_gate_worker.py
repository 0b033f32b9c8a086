"""A training process whose N-th asynchronous checkpoint never commits (see tests/training/test_faults.py).

    python tests/training/checkpoint_gate_worker.py N MARKER [kroberta.train arguments ...]

The N-th checkpoint's files are written by Orbax's background thread, then its
commit (the rename into place) waits forever and MARKER is created: the test kills
the process there, in the middle of an asynchronous write, while the step loop
goes on training.
"""

import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import kroberta.cli.train
from kroberta.training import checkpoint  # noqa: E402


def main() -> int:
    hold_at, marker, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    commits = []

    def before_commit():
        # Orbax's post-finalization callback: the files are complete, not yet renamed.
        commits.append(None)
        if len(commits) == hold_at:
            open(marker, "w").close()
            threading.Event().wait()  # forever

    def gated_checkpointer(asynchronous=False):
        import orbax.checkpoint as ocp

        if not asynchronous:
            return ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        options = ocp.options.AsyncOptions(post_finalization_callback=before_commit)
        return ocp.AsyncCheckpointer(ocp.CompositeCheckpointHandler(), async_options=options)

    checkpoint._checkpointer = gated_checkpointer
    return kroberta.cli.train.main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""SIGTERM (what a TPU/GCE preemption sends) asks the run to checkpoint and stop.

The handler only sets a flag; the training callback sees it at the end of the
current step, stops `fit`, and writes a checkpoint at that step before exiting.
"""

import signal
import threading


class PreemptionFlag:
    """Installs a SIGTERM handler for the duration of a `with` block."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame):
        self.requested = True

    def __enter__(self):
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        return False

"""SIGTERM (what a TPU/GCE preemption or a GPU scheduler sends) asks the run to checkpoint and stop;
so does a first Ctrl-C in a single-process run.

One process: a Python SIGTERM handler sets a flag; the training callback sees it
before the next step, lets that step run, stops `fit` and writes a checkpoint there.

Several processes: the notice may reach only one host, and every process must stop
at the same step (a checkpoint is a collective). JAX's coordination service does
this: `jax.distributed.initialize` starts a preemption sync manager whose own SIGTERM
handler tells the coordinator, which tells every process; each then computes the
same "sync point", one check past the furthest any process had reached, and
`multihost_utils.reached_preemption_sync_point(n)` turns true at that check on all
of them. So in a multi-process job no Python handler is installed (it would replace
JAX's), and every process calls `poll` at the same points of its step loop with a
counter that is the same on all (the number of earlier polls in this invocation).
"""

import signal
import sys
import threading
import time

# A second SIGINT this soon after the first is the same request: `timeout -s INT` and some
# schedulers signal the process and then its whole process group, so one interrupt arrives
# twice within milliseconds, while a person pressing Ctrl-C again takes longer.
SAME_INTERRUPT_SECONDS = 0.5

INTERRUPT_NOTICE = (
    "interrupt: finishing the steps in flight and writing a checkpoint; "
    "press Ctrl-C again to stop at once"
)


class PreemptionFlag:
    """A SIGTERM anywhere in the job, seen at the same step by every process; in a
    single-process run also Ctrl-C (SIGINT, a notebook's interrupt).

    Use as a `with` block around training; call `poll()` once per dispatch of steps
    (every process at the same points); `requested` stays true once it was.
    `interrupted` says the request was a Ctrl-C: the caller checkpoints as for SIGTERM,
    then raises KeyboardInterrupt. A second Ctrl-C (after `SAME_INTERRUPT_SECONDS`) raises
    KeyboardInterrupt at once.
    A SIGINT handler the user installed is left in place.
    """

    def __init__(self):
        self.requested = False
        self.interrupted = False
        self.job_wide = False  # True: JAX's coordination service agrees on the step
        self._polls = 0
        self._previous = None
        self._previous_interrupt = None
        self._interrupted_at = None

    def _handle(self, signum, frame):
        self.requested = True

    def _handle_interrupt(self, signum, frame):
        if self.interrupted:
            if time.monotonic() - self._interrupted_at < SAME_INTERRUPT_SECONDS:
                return
            raise KeyboardInterrupt
        self.interrupted = self.requested = True
        self._interrupted_at = time.monotonic()
        print(INTERRUPT_NOTICE, file=sys.stderr, flush=True)

    def __enter__(self):
        # start-up: `train` reads this module before JAX loads
        import jax
        from jax._src import distributed

        # JAX's preemption sync manager, when this process is one of a multi-process job.
        self.job_wide = (
            jax.process_count() > 1 and distributed.global_state.preemption_sync_manager is not None
        )
        # Signal handlers can only be installed from the main thread. In a job a Ctrl-C
        # reaches one process, and only SIGTERM has a job-wide agreement on the step.
        if not self.job_wide and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            # Python's default handler, or the commands' (`kroberta.cli.stop_signals`);
            # a handler of the caller's own stays.
            interrupt = signal.getsignal(signal.SIGINT)
            if interrupt is signal.default_int_handler or getattr(
                interrupt, "interrupts_by_default", False
            ):
                self._previous_interrupt = signal.signal(signal.SIGINT, self._handle_interrupt)
        return self

    def poll(self) -> bool:
        """True when the run should stop after the steps about to run."""
        if self.job_wide and not self.requested:
            # start-up: `train` reads this module before JAX loads
            from jax.experimental import multihost_utils

            # Blocks only while the processes agree on the sync point (after a notice).
            self.requested = multihost_utils.reached_preemption_sync_point(self._polls)
            self._polls += 1
        return self.requested

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self._previous_interrupt is not None:
            signal.signal(signal.SIGINT, self._previous_interrupt)
            self._previous_interrupt = None
        return False

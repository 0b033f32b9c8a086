"""prepare's worker processes: a pool that reports a dead worker instead of waiting for it.

`run_chunks` hands the chunks to a `concurrent.futures.ProcessPoolExecutor`. A worker
that dies (the out-of-memory killer's SIGKILL, any signal, `os._exit`) breaks the pool
at once (`BrokenProcessPool`), which does not say which task died: each worker marks
the chunks it starts in a shared array, so the error names the chunk(s) it was on,
how it died, and that the same command resumes. An error, an interrupt or a dead
worker stops the other workers at once (SIGTERM, then SIGKILL): never a wait for a
chunk to end.

Signals are the parent's to act on. Workers start with SIGINT and SIGTERM blocked (a
signal before a worker has set its own dispositions would run the handler it inherited
from the command, and print a traceback), then ignore SIGINT (Ctrl-C reaches the whole
process group: the parent stops the workers) and take SIGTERM at its default: a
SIGTERM ends a worker at once, without a Python handler or a traceback. A worker whose
parent is gone (kill -9 of the command) finishes the chunk it is on, then exits.

Workers are forked from a process that has not imported JAX or TensorFlow (the
command's); from one that has (a notebook, the tests), whose threads a fork would
copy mid-flight, they are spawned fresh: a script calling `prepare(workers=N)` then
needs the usual `if __name__ == "__main__":` guard.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from kroberta.errors import WorkerError
from kroberta.text import (
    workers,  # by module: a replaced `workers.prepare_chunk` reaches the workers
)

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
POLL_S = 0.5  # how often the progress bar hears the workers' bytes
STOP_GRACE_S = 2.0  # a worker sent SIGTERM is killed (SIGKILL) if still there after this
ORPHAN_CHECK_S = 1.0  # how often a worker looks whether its parent is still there


# One worker process's state, set by `_start_worker`.
_worker = {}


def _start_worker(job, parent, read, running):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked by `_workers_starting`
    # One thread of `tokenizers` per worker: the workers are the parallelism.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    busy = threading.Lock()  # held while a chunk is under way
    _worker.update(
        job=job, tok=workers.load_tokenizer_of(job), read=read, running=running, busy=busy
    )
    threading.Thread(target=_exit_when_orphaned, args=(parent, busy), daemon=True).start()


def _exit_when_orphaned(parent, busy):
    # Without its parent a worker would wait for the next chunk forever (it holds both
    # ends of the task queue's pipe itself).
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    with busy:  # the chunk under way is finished first: the next run keeps it
        os._exit(0)


def _run_in_worker(position, chunk):
    def count(nbytes):  # the chunk's own slot: no lock, which a killed worker could leave held
        _worker["read"][position] += nbytes

    with _worker["busy"]:
        _worker["running"][position] = os.getpid()
        return workers.prepare_chunk(_worker["job"], _worker["tok"], chunk, count)


def run_chunks(job, chunks, processes, progress):
    """Prepares the `chunks` with `processes` worker processes (1: in this one); `progress` (a
    `kroberta.console.Progress`) hears the bytes read. Returns the results, by chunk
    index. A worker that dies raises `WorkerError` naming the chunk it was on."""
    if processes <= 1 or len(chunks) <= 1:
        tok = workers.load_tokenizer_of(job)
        return {
            chunk.index: workers.prepare_chunk(job, tok, chunk, progress.add) for chunk in chunks
        }
    context = multiprocessing.get_context(start_method())
    # By chunk position, each written by the one worker on that chunk: its bytes read, its pid.
    read = context.Array("q", len(chunks), lock=False)
    running = context.Array("q", len(chunks), lock=False)
    executor = concurrent.futures.ProcessPoolExecutor(
        min(processes, len(chunks)),
        mp_context=context,
        initializer=_start_worker,
        initargs=(job, os.getpid(), read, running),
    )
    results = {}
    try:
        with _workers_starting():
            submitted = {
                executor.submit(_run_in_worker, position, chunk): chunk
                for position, chunk in enumerate(chunks)
            }
        _collect(submitted, read, progress, results)
        executor.shutdown()  # the workers are idle: they exit
    except BrokenProcessPool:
        children = _processes_of(executor)
        early = {p.pid: p.exitcode for p in children}  # before `_stop` ends the others
        _stop(executor, children)
        final = {p.pid: p.exitcode for p in children}
        raise WorkerError(_lost(chunks, running, early, final, results, job.work_dir)) from None
    except BaseException:  # an error in one chunk, Ctrl-C, SIGTERM: the others stop too
        _stop(executor, _processes_of(executor))
        raise
    return results


def _collect(submitted, read, progress, results):
    """Waits for the `submitted` futures (future -> chunk), putting their results into
    `results` as they come; the progress bar hears the bytes `read` (by chunk) meanwhile."""
    pending, reported = set(submitted), 0
    try:
        while pending:
            done, pending = concurrent.futures.wait(
                pending, timeout=POLL_S, return_when=concurrent.futures.FIRST_COMPLETED
            )
            now = sum(read)
            progress.add(now - reported)
            reported = now
            for future in done:
                result = future.result()  # a worker's error, raised here
                results[result.index] = result
    except BrokenProcessPool:
        # The chunks that finished before the pool broke are not in flight.
        for future, chunk in submitted.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                results[chunk.index] = future.result()
        raise


@contextlib.contextmanager
def _workers_starting():
    """Around the workers' start: `tokenizers`' thread pool off (forked workers must not
    inherit it: it warns, then turns it off) and SIGINT/SIGTERM blocked, which the
    workers inherit and unblock once their own handlers are set (`_start_worker`).
    A signal that arrived meanwhile reaches this process when the block ends."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # last: a pending Ctrl-C raises here


def _processes_of(executor) -> list:
    """The executor's worker processes (`multiprocessing.Process`), to stop them without
    waiting for their chunks and to read how one died. ProcessPoolExecutor has no public
    way to reach them: Python 3.14 adds `terminate_workers()` / `kill_workers()` but
    still nothing that gives an exit code, so its private `_processes` (pid -> Process,
    Python 3.8 to 3.14) is read here and nowhere else. [] where a Python has no such
    attribute (or after `shutdown`): `_stop` then kills through the public call."""
    return list((getattr(executor, "_processes", None) or {}).values())


def _stop(executor, processes):
    """Stops the executor and its `processes` now: workers sent SIGTERM, then SIGKILL
    after `STOP_GRACE_S` (an interrupt meanwhile kills them too), queued chunks cancelled."""
    try:
        if not processes and hasattr(executor, "kill_workers"):  # Python 3.14 and later
            executor.kill_workers()
        for process in processes:
            with contextlib.suppress(OSError, ValueError):
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.exitcode is None:
                with contextlib.suppress(OSError, ValueError):
                    process.kill()
                process.join(STOP_GRACE_S)
    # With no worker left, the pool's own thread ends at once: waited for, it cannot close
    # its pipes while the interpreter's exit writes to them (a traceback at exit).
    executor.shutdown(wait=True, cancel_futures=True)


def _lost(chunks, running, early, final, results, work_dir) -> str:
    """The line that says which worker died, how, on which chunk(s), and how to go on.
    `early`, `final`: pid -> exit code (None: alive, or not yet known) of every worker
    when the pool was found broken, and once all were stopped."""
    # The pool ends the other workers with SIGTERM as soon as one dies: the one that died
    # first did not die of that, or was already dead when the pool was found broken
    # (unless the pool's own thread had collected it first: then every SIGTERM is named).
    first = (
        {pid: code for pid, code in final.items() if code not in (None, -signal.SIGTERM)}
        or {pid: code for pid, code in early.items() if code is not None}
        or {pid: code for pid, code in final.items() if code is not None}
    )
    in_flight = [
        (chunk, running[position])
        for position, chunk in enumerate(chunks)
        if running[position] and chunk.index not in results
    ]
    lost = [chunk for chunk, pid in in_flight if pid in first]
    others = [chunk for chunk, pid in in_flight if pid not in first]
    how, hint = _death(next(iter(first.values()), None))
    line = how + (
        f" while preparing {'one of ' if len(lost) > 1 else ''}{_named(lost)}"
        if lost
        else " between chunks"
    )
    line += f": {hint}" if hint else ""
    if others:
        line += f"; {_named(others)} {'was' if len(others) == 1 else 'were'} running{' too' if lost else ''}"
    return line + f"; the finished chunks are kept in {work_dir}: the same command resumes"


def _death(code) -> tuple[str, str]:
    """(how a worker with exit code `code` ended, the likely cause or "")."""
    if code is None:
        return "a worker process died", ""
    if code < 0:
        how = f"a worker process was killed (signal {-code})"
        return how, "out of memory? lower --workers" if -code == signal.SIGKILL else ""
    return f"a worker process exited (code {code})", ""


def _named(chunks) -> str:
    return " and ".join(chunk.describe() for chunk in chunks)


def start_method():
    """ "fork" where it is safe and available, else "spawn"."""
    threaded = any(name in sys.modules for name in ("jax", "tensorflow"))
    return "fork" if not threaded and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def default_workers():
    """The CPU cores this process may use."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

"""Collective timeouts of XLA's CPU backend, long enough for a loaded machine.

Simulated CPU devices (`--xla_force_host_platform_device_count=N`) run each
device's share of a step on its own thread; an all-reduce is a rendezvous of the N
threads. A thread waiting there warns after
`--xla_cpu_collective_call_warn_stuck_timeout_seconds` (default 20 s), then waits
`--xla_cpu_collective_call_terminate_timeout_seconds` more (default 40 s) and aborts
the whole process (SIGABRT, nothing saved): one thread a minute late is fatal, and
a machine loaded by other jobs delays a thread that long: the other
threads wait at the rendezvous without using the cores, the late one is simply not
scheduled. A slow thread is not a deadlock, so kroberta gives the rendezvous an
hour (`TERMINATE_SECONDS`), and the CPU collective operations' own timeout
(`--xla_cpu_collective_timeout_seconds`) the same hour: no load
seen on a shared machine comes near it, while a true deadlock (a bug, or more
simulated devices than the runtime can run at once) still ends with XLA's own
message instead of hanging forever. XLA's warning about a stuck rendezvous
(after 20 s) is kept: it names the waiting threads in the log.

A value the user put in XLA_FLAGS wins. The flags concern only XLA's CPU backend.
"""

import os

from kroberta.runtime import xla_cpu

TERMINATE_SECONDS = 3600
TERMINATE_FLAG = "--xla_cpu_collective_call_terminate_timeout_seconds"
COLLECTIVE_FLAG = "--xla_cpu_collective_timeout_seconds"


def use_patient_collectives() -> bool:
    """Add both timeouts to XLA_FLAGS; must run before JAX starts its backends.

    Returns whether both timeouts (kroberta's, or the user's own) are set for this
    process's future backends: False when JAX already started (XLA has read its flags).
    """
    if xla_cpu._backend_started():
        return False
    flags = os.environ.get("XLA_FLAGS", "").split()
    for name in (TERMINATE_FLAG, COLLECTIVE_FLAG):
        if not any(f.startswith(name + "=") for f in flags):
            flags.append(f"{name}={TERMINATE_SECONDS}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    return True

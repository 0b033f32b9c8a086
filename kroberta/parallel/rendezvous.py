"""A pre-flight handshake on the coordinator's port, before `jax.distributed.initialize`.

JAX's distributed client aborts the whole process (a C++ fatal error, no Python
exception) when the coordinator cannot be reached or a process never arrives, and
it never notices processes started with different `num_processes`. So every
process first meets the others here, over plain TCP on the coordinator's port:
process 0 listens, the others connect and say who they are; process 0 answers
"ok" only when all N arrived with the same N. Any problem becomes a ConfigError
naming the key, in every process, within `initialization_timeout` seconds. Then
the port is released and JAX's own coordination service binds it.
"""

import contextlib
import json
import socket
import time

from kroberta.errors import ConfigError

_RETRY_SECONDS = 0.25


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), int(port)


def meet(coordinator: str, num_processes: int, process_id: int, timeout: float):
    """Returns when all `num_processes` processes reached `coordinator`; else ConfigError."""
    if process_id == 0:
        _host(coordinator, num_processes, timeout)
    else:
        _join(coordinator, num_processes, process_id, timeout)


def _host(coordinator: str, num_processes: int, timeout: float):
    _, port = _split(coordinator)
    try:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", port))
    except OSError as error:
        raise ConfigError(
            f"distributed.coordinator: process 0 cannot listen on port {port} "
            f"({error.strerror or error}); choose a free port"
        ) from None
    deadline = time.monotonic() + timeout
    peers = {}  # process id -> connection
    problem = None
    with server:
        while len(peers) < num_processes - 1 and problem is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(1, num_processes)) - set(peers))
                problem = (
                    f"distributed.initialization_timeout: only {len(peers) + 1} of "
                    f"{num_processes} processes reached the coordinator {coordinator} "
                    f"within {timeout:g} s (missing process_id(s): "
                    f"{', '.join(map(str, missing))})"
                )
                break
            server.settimeout(remaining)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            hello = _read_line(conn, max(deadline - time.monotonic(), 1.0))
            try:
                other_id, other_count = int(hello["process_id"]), int(hello["num_processes"])
            except (TypeError, KeyError, ValueError):
                conn.close()  # not one of ours (a port scanner, a stale client): ignore it
                continue
            if other_count != num_processes:
                problem = (
                    f"distributed.num_processes: process {other_id} was started with "
                    f"num_processes={other_count}, process 0 with {num_processes}"
                )
            elif not 0 < other_id < num_processes or other_id in peers:
                problem = (
                    f"distributed.process_id: two processes claim process_id={other_id}"
                    if other_id in peers or other_id == 0
                    else f"distributed.process_id: {other_id} is outside [0, {num_processes})"
                )
            peers.setdefault(other_id, conn)
            if conn is not peers[other_id]:
                _answer(conn, problem)
        for conn in peers.values():
            _answer(conn, problem)
    if problem:
        raise ConfigError(problem)


def _answer(conn, problem):
    with contextlib.closing(conn), contextlib.suppress(OSError):
        conn.sendall((json.dumps({"ok": problem is None, "problem": problem}) + "\n").encode())
        # Wait for the peer to close first, so this port has no connection left in
        # TIME_WAIT when JAX's coordination service binds it.
        conn.settimeout(5.0)
        conn.recv(1)


def _join(coordinator: str, num_processes: int, process_id: int, timeout: float):
    host, port = _split(coordinator)
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection(
                (host, port), timeout=max(min(deadline - time.monotonic(), 5.0), 0.1)
            )
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"distributed.coordinator: nothing answered at {coordinator} within "
                    f"{timeout:g} s (distributed.initialization_timeout); start process 0 there, "
                    "or check the address and the firewall"
                ) from None
            time.sleep(_RETRY_SECONDS)
    with conn:
        hello = {"process_id": process_id, "num_processes": num_processes}
        conn.sendall((json.dumps(hello) + "\n").encode())
        # Process 0 answers once everyone arrived, or when its own timeout ran out.
        verdict = _read_line(conn, max(deadline - time.monotonic(), 0) + 10.0)
    if verdict is None:
        raise ConfigError(
            f"distributed.initialization_timeout: the coordinator {coordinator} "
            f"did not see all {num_processes} processes within {timeout:g} s"
        )
    if not verdict.get("ok"):
        raise ConfigError(verdict.get("problem") or "the coordinator refused this process")


def _read_line(conn, timeout: float):
    """One JSON line, or None on timeout, closed connection or garbage."""
    conn.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                return None
            data += chunk
            if len(data) > 65536:
                return None
        return json.loads(data)
    except (OSError, ValueError):
        return None

"""jax's coordination service in a process of its own, started by process 0 of a cluster run
(:func:`jaxfl.cluster.init_cluster`), so that losing process 0 does not take the service with it.

Inside process 0, the service died with it, and every other process's jax client, which polls the
service for errors, aborted at once (SIGABRT, a C++ stack trace, no word of the run folder), often
before the collective that jaxfl reads as a lost peer had failed. Here the service outlives process
0 until the other processes have gone (their next collective fails, and they end with jaxfl's line
saying what the run folder keeps) or for at most ``grace_s`` seconds.

Run as ``python -P _coordination_service.py '[ARGS, KWARGS, GRACE_S]'``: ARGS and KWARGS are jax's
own for ``get_distributed_runtime_service``. It prints one JSON line (``{"serving": true}`` or
``{"error": ...}``), then serves until a line ``stop`` on its standard input (process 0's orderly
shutdown) or the end of that input (process 0 gone). Process 0 says ``barrier`` and ``free`` around
a checkpoint's save or restore: gone in between, it leaves the others waiting at a barrier that cannot
pass, and the service stops at once. Run without ``-m`` so that it starts without
importing jaxfl.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time


def established_connections(port: int) -> int | None:
    """How many TCP connections to local ``port`` are established (Linux's /proc/net), or None where
    that cannot be read."""
    count, read_any = 0, False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    local_port = int(fields[1].rpartition(":")[2], 16)
                    count += local_port == port and fields[3] == "01"  # 01: TCP_ESTABLISHED
            read_any = True
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return count if read_any else None


def _what_process_0_left() -> str:
    """Wait for process 0 to say ``stop`` or to end without it, and return its last word: ``stop``, or
    ``barrier`` where it ended between ``barrier`` and ``free`` (in a checkpoint's save or restore, at
    which the others wait for it at the service's barriers), else ``free``. Its end shows as the end of
    this standard input, or as another parent where a child it forked holds that input open."""
    parent, said = os.getppid(), ["free"]

    def read() -> None:
        for line in sys.stdin:
            said.append(line.strip())
            if said[-1] == "stop":
                return

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    while reading.is_alive() and os.getppid() == parent:
        reading.join(0.2)
    return said[-1]


def main() -> int:
    # a terminal's Ctrl-C and SLURM's SIGTERM reach the whole process group: process 0 stops the service
    # in its own orderly shutdown, and stopping it earlier would abort the processes still ending theirs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args, kwargs, grace_s = json.loads(sys.argv[1])
    try:
        from jax._src.lib import _jax

        service = _jax.get_distributed_runtime_service(*args, **kwargs)
    except Exception as error:  # e.g. the port is taken: process 0 raises it as its own
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
        return 1
    print(json.dumps({"serving": True}), flush=True)
    # process 0 gone without stopping the service, where the others are not left waiting at a barrier
    if _what_process_0_left() == "free":
        quiet = os.open(os.devnull, os.O_WRONLY)  # nobody reads process 0's output any more: not held open
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        port = int(str(args[0]).rpartition(":")[2])
        deadline = time.monotonic() + grace_s
        time.sleep(0.5)  # the last connection of process 0's own client closing
        while time.monotonic() < deadline and established_connections(port) != 0:
            time.sleep(0.5)
    service.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

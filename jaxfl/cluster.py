"""Runs over several processes (hosts): ``jax.distributed`` with one scheduler per process.

Every process runs the same deterministic scheduler on the same config and seed, so all of them
make the same decisions without exchanging any, but whether to stop after an evaluation: process
0's loggers and accuracy decide that, and :func:`broadcast_text` hands the decision to the others
(:mod:`jaxfl.experiment`). The engine's training calls span every process's
devices (one global ``Mesh``), each process contributing its devices' clients, and each gathers
the trained updates back to keep the same global model. Process 0 writes the run directory; the
others write nothing that stays (their logs go to a scratch folder), except their part of each
checkpoint: every process takes part in orbax's save of the device state into process 0's run
directory, which must therefore be on a filesystem every host sees at the same ``output_dir``
(:mod:`jaxfl.checkpoint`). Process 0 alone writes the scheduler's pickled state, the same on every
process. Such a run resumes with the same command plus ``--resume RUN_DIR``: every process
restores the same checkpoint, process 0's newest one that reads back on all of them
(:func:`jaxfl.resume.load_checkpoint`), and the run goes on as if never stopped. (A checkpoint
reads back whatever number of processes wrote it: one process can resume a cluster run too.)

Start one process per host (or several on one machine) with the same command plus::

    jaxfl run ... --coordinator-address HOST:PORT --num-processes N --process-id I

or, from Python, call :func:`init_cluster` before anything else uses jax. With no arguments,
``jax.distributed.initialize`` reads SLURM's (and other cluster managers') environment, so under
``srun`` the flags are not needed. On CPUs the processes exchange updates with gloo.

>>> import jaxfl.cluster
>>> jaxfl.cluster.process_index(), jaxfl.cluster.process_count()
(0, 1)
"""
from __future__ import annotations

import jax
import numpy as np

from jaxfl._devices import backends_started

__all__ = ["all_processes", "broadcast_text", "init_cluster", "process_count", "process_index"]


def init_cluster(coordinator_address: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None) -> None:
    """Join a run of several processes (``jax.distributed.initialize``); call it before any jax
    computation. Arguments left out come from the environment (SLURM, Open MPI, JAX_COORDINATOR_ADDRESS...).

    >>> # init_cluster("10.0.0.1:1234", num_processes=2, process_id=0)   # on the first host
    """
    if backends_started():
        raise RuntimeError("init_cluster must run before anything uses jax (its backends have started); "
                           "call it first thing in the process")
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and value < 0:
            raise ValueError(f"{name}={value} must be 0 or more")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"process_id={process_id} must be below num_processes={num_processes}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes exchange with gloo
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id)


def process_index() -> int:
    """This process's index (0 writes the run directory)."""
    return jax.process_index()


def process_count() -> int:
    """Processes in the run (1 without :func:`init_cluster`)."""
    return jax.process_count()


def broadcast_text(text: str) -> str:
    """Process 0's ``text`` on every process (collective: every process calls it at the same point).

    >>> broadcast_text("fedbuff-mnist10k-exp-c10")  # one process: the text itself
    'fedbuff-mnist10k-exp-c10'
    """
    if jax.process_count() == 1:
        return text
    from jax.experimental.multihost_utils import broadcast_one_to_all

    data = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
    length = int(broadcast_one_to_all(np.int32(len(data))))  # the other processes' texts may be longer or shorter
    padded = np.zeros(length, np.int32)
    padded[:min(length, len(data))] = data[:length]
    return bytes(broadcast_one_to_all(padded).astype(np.uint8).tolist()).decode()


def all_processes(flag: bool) -> list[bool]:
    """``flag`` of every process, in process order (collective, like :func:`broadcast_text`).

    >>> all_processes(True)
    [True]
    """
    if jax.process_count() == 1:
        return [bool(flag)]
    from jax.experimental.multihost_utils import process_allgather

    return [bool(value) for value in np.asarray(process_allgather(np.int32(flag))).reshape(-1)]

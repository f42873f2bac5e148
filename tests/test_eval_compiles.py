"""Evaluation compiles once per run: the first evaluation (the initial, uncommitted params) and the
later ones (the engine's committed params) used to compile the held-out pass twice."""
import logging

import jax

from conftest import replace

from jaxfl import run_experiment


class _Compiles(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.names.append(message.split(" ")[1])


def test_the_held_out_pass_compiles_once_per_run(small_config):
    handler, logger = _Compiles(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            result = run_experiment(replace(small_config, algorithm="fedavg", max_updates=3, stop_at_target=False))
    finally:
        logger.removeHandler(handler)
    assert len(result.metrics) == 4  # evaluated at the start and after each of the 3 updates
    assert handler.names.count("jit(mapped_stats)") == 1, handler.names

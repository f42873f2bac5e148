"""Scheduler: the virtual clock, client-speed models and (later) one policy per algorithm.

Plain Python + numpy only; this package must never import jax (tests/test_scheduler_no_jax.py).
"""

from jaxfl.scheduler.clock import DEFAULT_PRIORITIES, Event, EventQueue
from jaxfl.scheduler.speeds import (
    NEGATIVE_POLICIES,
    SPEED_MODELS,
    ClientSpeeds,
    ScriptedSpeeds,
    SpeedConfig,
)

__all__ = [
    # clock
    "DEFAULT_PRIORITIES",
    "Event",
    "EventQueue",
    # speeds
    "NEGATIVE_POLICIES",
    "SPEED_MODELS",
    "ClientSpeeds",
    "ScriptedSpeeds",
    "SpeedConfig",
]

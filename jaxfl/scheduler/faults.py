"""Client faults on the virtual clock (plain Python + numpy).

Per dispatch, each client independently may:
- ``crash``: stop mid-round and never return (its update is dropped, reason "client crashed").
  The policy's ``on_crash`` hook hears of it: FedBuff and FedAsync dispatch a replacement from
  their idle clients; the others do nothing, so a policy that waits for the client needs a deadline;
- ``delay``: return, but ``delay_factor`` times later than its round would take;
- ``dropout``: go offline for Exp(``dropout_mean``) virtual seconds during the round, then finish.

A delay's or a dropout's added seconds are not training: the event log's dispatch row names them
(:func:`fault_detail`, ``"dropout 61.5 s"``), and the utilisation, live
(:meth:`~jaxfl.scheduler.simulation.Simulation.timeline`) or from the log
(:func:`jaxfl.runlog.timeline_stats`), leaves them out, placed at the round's start. The dispatch
still counts as in flight over them (the server has sent it and has not heard back).

Draws come from one stream per client (``SeedSequence([seed, FAULT_STREAM, client])``, kept as
arrays by :class:`~jaxfl.scheduler.speeds.ClientStreams`), so a client's k-th dispatch meets the
same fault whatever the algorithm.

>>> faults = ClientFaults(FaultConfig(crash_prob=1.0), num_clients=2, seed=0)
>>> faults.draw(0).kind
'crash'
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import re

from jaxfl.scheduler.speeds import ClientStreams

FAULT_STREAM = 0x5EED0003


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    """Per-dispatch fault probabilities (all 0: no faults)."""

    crash_prob: float = 0.0
    delay_prob: float = 0.0
    delay_factor: float = 10.0
    dropout_prob: float = 0.0
    dropout_mean: float = 60.0

    def __post_init__(self):
        for name in ("crash_prob", "delay_prob", "dropout_prob", "delay_factor", "dropout_mean"):
            value = getattr(self, name)
            # a string or None failed the comparisons below with a TypeError naming neither; a bool
            # passed as 0 or 1
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name}={value!r} is not allowed: a number")
        for name in ("crash_prob", "delay_prob", "dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value!r} is not allowed: a probability in [0, 1]")
        if self.crash_prob + self.delay_prob + self.dropout_prob > 1.0:
            raise ValueError("crash_prob + delay_prob + dropout_prob must be at most 1, got "
                             f"{self.crash_prob + self.delay_prob + self.dropout_prob}")
        if not (self.delay_factor >= 1.0 and math.isfinite(self.delay_factor)):
            raise ValueError(f"delay_factor={self.delay_factor!r} is not allowed: a finite factor >= 1")
        if not (self.dropout_mean > 0 and math.isfinite(self.dropout_mean)):
            raise ValueError(f"dropout_mean={self.dropout_mean!r} is not allowed: finite seconds > 0")

    @property
    def active(self) -> bool:
        return self.crash_prob + self.delay_prob + self.dropout_prob > 0


@dataclasses.dataclass(frozen=True)
class Fault:
    """What happens to one dispatch: ``kind`` in (None, "crash", "delay", "dropout").

    ``fraction``: how far into the round a crash happens; ``extra_time``: added seconds.
    """

    kind: str | None
    fraction: float = 1.0
    extra_time: float = 0.0


class ClientFaults:
    """Draws one :class:`Fault` per dispatch from each client's own stream.

    Example:
        >>> faults = ClientFaults(FaultConfig(delay_prob=1.0, delay_factor=3.0), num_clients=10**6, seed=1)
        >>> faults.draw(999_999, duration=2.0)
        Fault(kind='delay', fraction=1.0, extra_time=4.0)
    """

    def __init__(self, config: FaultConfig, num_clients: int, seed: int):
        num_clients = operator.index(num_clients)
        if num_clients < 1:
            raise ValueError(f"num_clients={num_clients}; must be >= 1")
        self.config = config
        self.num_clients = num_clients
        self._streams = ClientStreams(seed, FAULT_STREAM, num_clients)
        self.counts = {"crash": 0, "delay": 0, "dropout": 0}

    def draw(self, client: int, duration: float = 1.0) -> Fault:
        """The fault of ``client``'s next dispatch whose fault-free round lasts ``duration``."""
        client = operator.index(client)
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client={client} out of range [0, {self.num_clients})")
        streams = self._streams
        rng = streams.load(client)
        try:
            u, fraction, offline = rng.random(), rng.random(), rng.exponential(self.config.dropout_mean)
        finally:
            streams.save(client)
        config = self.config
        if u < config.crash_prob:
            kind, fault = "crash", Fault("crash", fraction=fraction)
        elif u < config.crash_prob + config.delay_prob:
            kind, fault = "delay", Fault("delay", extra_time=(config.delay_factor - 1.0) * duration)
        elif u < config.crash_prob + config.delay_prob + config.dropout_prob:
            kind, fault = "dropout", Fault("dropout", extra_time=float(offline))
        else:
            return Fault(None)
        self.counts[kind] += 1
        return fault


# "delay 13.2 s" / "dropout 61.5 s" at the end of a dispatch's detail, after a policy's own ("group 3; ")
_FAULT_SECONDS = re.compile(r"(?:^|; )(?:delay|dropout)( (\S+) s)$")


def fault_detail(kind: str, seconds: float = 0.0) -> str:
    """A dispatch's fault as its event-log row says it: ``crash``, or ``delay``/``dropout`` with the
    seconds it added (offline, or late), in full precision so that the log gives the live figures.

    >>> fault_detail("dropout", 61.5), fault_detail("crash")
    ('dropout 61.5 s', 'crash')
    """
    return kind if kind == "crash" else f"{kind} {float(seconds)!r} s"


def split_fault_seconds(detail: str | None) -> tuple[str | None, float]:
    """``(detail without a fault's seconds, those seconds)`` of a dispatch row; 0.0 where none are
    named, as in logs written before they were (a delay or dropout there reads as training time).

    >>> split_fault_seconds("group 2; dropout 61.5 s"), split_fault_seconds("delay")
    (('group 2; dropout', 61.5), ('delay', 0.0))
    """
    if type(detail) is not str:
        return detail, 0.0
    match = _FAULT_SECONDS.search(detail)
    if match is None:
        return detail, 0.0
    try:
        seconds = float(match.group(2))
    except ValueError:
        return detail, 0.0
    return detail[:match.start(1)], seconds

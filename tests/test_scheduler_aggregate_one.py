"""Simulation.aggregate of one update (FedAsync's path, checked without loops) refuses what the general path refuses."""
import math

import numpy as np
import pytest

from jaxfl.scheduler.simulation import ARRIVED, IN_FLIGHT, Policy, Simulation
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from tests.conftest import RecordingBackend


def simulation_with_records(count):
    sim = Simulation(Policy(), ClientSpeeds(SpeedConfig(model="exp"), 4, seed=0), np.full(4, 0.25), RecordingBackend())
    return sim, [sim.dispatch(client, 3) for client in range(count)]


def arrive(sim, record):
    record.status = ARRIVED
    sim._counts[IN_FLIGHT] -= 1
    sim._counts[ARRIVED] += 1


@pytest.mark.parametrize("contributions", [1, 2], ids=["one update", "two updates"])
def test_aggregate_refuses_in_flight_aggregated_and_non_finite_alike(contributions):
    sim, records = simulation_with_records(2)
    with pytest.raises(ValueError, match=r"dispatch 0 \(client 0\) is in_flight, only arrived updates"):
        sim.aggregate([(record.id, 0.5) for record in records[:contributions]])
    for record in records:
        arrive(sim, record)
    with pytest.raises(ValueError, match="aggregation coefficient for dispatch 0 is nan"):
        sim.aggregate([(record.id, math.nan) for record in records[:contributions]])
    assert sim.aggregate([(record.id, 0.5) for record in records[:contributions]]) == 1
    assert sim.backend.aggregations[0].contributions == tuple((record.id, 0.5) for record in records[:contributions])
    assert sim.accounting()["aggregated"] == contributions
    with pytest.raises(ValueError, match=r"dispatch 0 \(client 0\) is aggregated"):
        sim.aggregate([(0, 0.5)])
    with pytest.raises(KeyError, match="no dispatch 7"):
        sim.aggregate([(7, 0.5)])


@pytest.mark.parametrize("given", [list, tuple, iter], ids=["list", "tuple", "iterator"])
def test_one_update_is_recorded_as_python_numbers_however_it_is_given(given):
    sim, (record,) = simulation_with_records(1)
    arrive(sim, record)
    sim.aggregate(given([(np.int64(record.id), np.float64(0.25))]))
    ((dispatch_id, coefficient),) = sim.backend.aggregations[0].contributions
    assert (type(dispatch_id), type(coefficient), dispatch_id, coefficient) == (int, float, record.id, 0.25)

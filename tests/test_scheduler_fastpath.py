"""The timing-only fast paths of session 42 (issue 13): the event log's Parquet spill converts its
buffered row tuples as one struct array, and FedCompass reads p_i from a list of Python floats.
Each is checked against the path it replaces: the same arrow table, the same weights, the same
event log."""
import pickle

import numpy as np
import pytest

from jaxfl.algorithms.fedcompass import FedCompass
from jaxfl.runlog import EVENT_LOG_FIELDS, EventLog, _pyarrow, _rows_to_arrow, _to_arrow, read_events
from jaxfl.scheduler.simulation import Simulation, TimingBackend
from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig
from jaxfl.scheduler.staleness import make_staleness

pytestmark = pytest.mark.skipif(_pyarrow() is None, reason="needs pyarrow")


def _rows(count: int) -> list[tuple]:
    rows = []
    for k in range(count):
        rows.append((0.5 * k, "arrival", k % 7, k, k // 3, 2, 20, None if k % 5 else "pulled: 3 of 20 steps", None))
        rows.append((0.5 * k, "aggregate", -1, None, k + 1, None, None, "1 updates", 0.001 * k))
        rows.append((0.5 * k, "dispatch", k % 7, k + 7, k + 1, None, 12, f"group {k % 4}", None))
    return rows


def _columns(rows: list[tuple]) -> list[list]:
    return [[row[index] for row in rows] for index in range(len(EVENT_LOG_FIELDS))]


def test_struct_conversion_is_the_column_conversion():
    rows = _rows(1_000)
    table = _rows_to_arrow(rows, EVENT_LOG_FIELDS)
    reference = _to_arrow(_columns(rows), EVENT_LOG_FIELDS)
    assert table.equals(reference) and table.schema.equals(reference.schema, check_metadata=True)
    assert table.num_rows == 3_000 and table.column("detail").null_count == 800


def test_values_of_other_types_fall_back_to_coercion():
    """A NumPy integer or a number in a string field is refused by the struct conversion (None), so
    the spill coerces them column by column as before: the log holds the coerced values."""
    rows = [(np.float64(1.5), "arrival", np.int64(3), 4, 0, 0, 20, 17, None)]
    assert _rows_to_arrow(rows, EVENT_LOG_FIELDS) is None
    import tempfile

    run_dir = tempfile.mkdtemp()
    with EventLog(run_dir, format="parquet") as log:
        log.row_writer(EVENT_LOG_FIELDS)(rows[0])
    events = read_events(run_dir)
    assert events["client"].tolist() == [3] and events["detail"].tolist() == ["17"]


def _compass_run(clients: int, updates: int):
    policy = FedCompass(4, 20, make_staleness("polynomial", alpha=0.9, a=0.5))
    weights = np.random.default_rng(3).dirichlet(np.ones(clients))
    rows = []
    simulation = Simulation(policy, ClientSpeeds(SpeedConfig(model="exp"), clients, seed=5), weights,
                            TimingBackend(), max_updates=updates, log=lambda row: rows.append(row))
    return simulation, rows


def test_compass_weights_are_the_arrays_floats():
    simulation, _ = _compass_run(200, 300)
    simulation.run()
    policy = simulation.policy
    assert policy._weights_list == [float(w) for w in simulation.client_weights]
    record = next(iter(simulation.records.live.values()))
    expected = policy._staleness_weights[simulation.version - record.version] * float(
        simulation.client_weights[record.client])
    assert policy._weight(simulation, record) == expected


def test_compass_pickle_leaves_the_weights_list_out_and_resumes_the_same():
    """A checkpoint does not carry the p_i twice; a run pickled mid-way and resumed writes the rows
    of a run straight through."""
    straight, straight_rows = _compass_run(300, 400)
    straight.run()
    paused, paused_rows = _compass_run(300, 200)
    paused.run()
    state = pickle.dumps(paused)
    assert paused.policy._weights_list is not None
    resumed = pickle.loads(state)
    assert resumed.policy._weights_list is None
    resumed_rows = list(paused_rows)
    resumed.attach(TimingBackend(), log=lambda row: resumed_rows.append(row))
    resumed.max_updates = 400
    resumed.run()
    strip = [{k: v for k, v in row.items() if k != "wall_time"} for row in straight_rows]
    assert [{k: v for k, v in row.items() if k != "wall_time"} for row in resumed_rows] == strip
    assert resumed.events_processed == straight.events_processed

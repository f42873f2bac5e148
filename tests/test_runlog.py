"""The event log at scale (jaxfl.runlog): CSV byte for byte as before, the automatic switch to
Parquet, resume cut-back in each format, readers, and the schedule statistics."""
import csv
import dataclasses
import io
import os
import re
import shutil

import numpy as np
import pytest

import jaxfl
import jaxfl.runlog
from jaxfl.runlog import (EVENT_LOG_FIELDS, EventLog, event_log_format, load_run, read_events, read_metrics,
                          timeline_stats)

pytest.importorskip("pyarrow")

SAMPLE_ROWS = [
    {"time": 0.0, "event": "dispatch", "client": 0, "dispatch": 0, "version": 0, "staleness": None, "steps": 5,
     "detail": None},
    {"time": 0.1 + 0.2, "event": "dispatch", "client": 1, "dispatch": 1, "version": 0, "staleness": None,
     "steps": 5, "detail": "group 3; delay"},
    {"time": 1e-7, "event": "arrival", "client": 0, "dispatch": 0, "version": 0, "staleness": 0, "steps": 5,
     "detail": None},
    {"time": 123456789.123, "event": "aggregate", "client": -1, "dispatch": None, "version": 1, "staleness": None,
     "steps": None, "detail": "1 updates"},
    {"time": np.float64(2.5), "event": "drop", "client": np.int64(1), "dispatch": 1, "version": 0, "staleness": 1,
     "steps": 5, "detail": 'non-finite, "quoted"\nupdate'},
    {"time": 1e22, "event": "timer", "client": -1, "dispatch": None, "version": 1, "staleness": None, "steps": None,
     "detail": ""},
    {"time": 3, "event": "fetch", "client": 2, "dispatch": 7, "version": 4, "staleness": 2, "steps": 3,
     "detail": "fresh model"},
]


def dictwriter_bytes(rows, fields=EVENT_LOG_FIELDS) -> bytes:
    """What experiment.py wrote before: csv.DictWriter with its header, in a newline='' file."""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fields)
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue().encode()


def synthetic_events(clients: int, rounds: int, buffer_size: int = 10, seed: int = 0):
    """Columns of a FedBuff-like schedule: each client trains ``rounds`` rounds back to back with
    exponential durations, an aggregation every ``buffer_size`` arrivals, staleness from versions."""
    rng = np.random.default_rng(seed)
    durations = rng.exponential(1.0, (clients, rounds)) * rng.uniform(0.5, 2.0, (clients, 1))
    ends = np.cumsum(durations, axis=1)
    # the next round starts exactly when the last one arrives, as a reply does
    starts, ends = np.concatenate([np.zeros((clients, 1)), ends[:, :-1]], axis=1).ravel(), ends.ravel()
    client = np.repeat(np.arange(clients), rounds)
    order = np.argsort(starts, kind="stable")
    dispatch_id = np.empty(len(starts), np.int64)
    dispatch_id[order] = np.arange(len(starts))
    aggregate_times = np.sort(ends)[buffer_size - 1::buffer_size]
    version_at = lambda t: np.searchsorted(aggregate_times, t, side="left")  # noqa: E731
    start_version = version_at(starts)
    n, a = len(starts), len(aggregate_times)
    time = np.concatenate([starts, ends, aggregate_times])
    kind = np.concatenate([np.zeros(n, np.int8), np.ones(n, np.int8), np.full(a, 2, np.int8)])
    # at one instant: the arrival, its aggregation, then the reply's dispatch
    order = np.lexsort((np.array([2, 0, 1])[kind], time))
    columns = {
        "time": time,
        "event": np.array(["dispatch", "arrival", "aggregate"], object)[kind],
        "client": np.concatenate([client, client, np.full(a, -1)]),
        "dispatch": np.concatenate([dispatch_id, dispatch_id, np.full(a, -1)]),
        "version": np.concatenate([start_version, start_version, np.arange(1, a + 1)]),
        "staleness": np.concatenate([np.full(n, -1), version_at(ends) - start_version, np.full(a, -1)]),
        "steps": np.concatenate([np.full(2 * n, 5), np.full(a, -1)]),
        "detail": np.concatenate([np.where(client % 7 == 0, "group 1", None).astype(object),
                                  np.full(n, None, object), np.full(a, f"{buffer_size} updates", object)]),
        "wall_time": np.concatenate([np.full(2 * n, np.nan), np.round(0.5 + 0.01 * np.arange(a), 3)]),
    }
    return {key: value[order] for key, value in columns.items()}


def rows_of(columns):
    """The columns as Simulation._write's dicts (None for -1), generated lazily."""
    names = list(columns)
    lists = [[None if (v == -1 and name not in ("client", "time")) or v != v else v for v in columns[name].tolist()]
             for name in names]
    for values in zip(*lists):
        yield dict(zip(names, values))


def assert_same_columns(got, want):
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name], equal_nan=got[name].dtype == np.float64), name


# --------------------------------------------------------------------------- CSV byte for byte
def test_csv_is_byte_identical_to_dictwriter(tmp_path):
    with EventLog(str(tmp_path), format="csv", buffer_rows=3) as log:
        for row in SAMPLE_ROWS:
            log.write(row)
    assert (tmp_path / "events.csv").read_bytes() == dictwriter_bytes(SAMPLE_ROWS)


def test_auto_below_the_switch_writes_the_same_csv_and_reads_it_back(tmp_path):
    with EventLog(str(tmp_path)) as log:
        for row in SAMPLE_ROWS:
            log.write(row)
    assert event_log_format(str(tmp_path)) == "csv"
    assert (tmp_path / "events.csv").read_bytes() == dictwriter_bytes(SAMPLE_ROWS)
    columns = read_events(str(tmp_path))
    assert columns["time"].tolist() == [float(row["time"]) for row in SAMPLE_ROWS]  # repr round-trips
    assert columns["staleness"].tolist() == [-1, -1, 0, -1, 1, -1, 2]
    assert columns["detail"].tolist() == [None, "group 3; delay", None, "1 updates",
                                          'non-finite, "quoted"\nupdate', None, "fresh model"]  # "" reads as None


def test_without_pyarrow_auto_stays_csv_and_the_reader_gives_the_same_columns(tmp_path, monkeypatch):
    columns = synthetic_events(clients=10, rounds=10)
    monkeypatch.setattr(jaxfl.runlog, "_pyarrow", lambda: None)
    (tmp_path / "b").mkdir()
    with EventLog(str(tmp_path / "b"), switch_rows=50, buffer_rows=16) as log:
        for row in rows_of(columns):
            log.write(row)
        assert log.format == "csv"
    assert_same_columns(read_events(str(tmp_path / "b")), columns)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        EventLog(str(tmp_path / "b"), format="parquet")


def test_rows_follow_dictwriter_rules_for_missing_and_unknown_keys(tmp_path):
    log = EventLog(str(tmp_path), fields=("time", "event", "detail"), format="csv")
    log.write({"time": 1.0, "event": "timer"})  # detail missing: empty, as DictWriter's restval
    with pytest.raises(ValueError, match="not in fieldnames"):
        log.write({"time": 1.0, "event": "timer", "extra": 1})
    with pytest.raises(ValueError, match="not in fieldnames"):
        log.write({"time": 1.0, "event": "timer", "other": 1})  # same size, other keys
    log.close()
    assert (tmp_path / "events.csv").read_bytes() == dictwriter_bytes([{"time": 1.0, "event": "timer"}],
                                                                      ("time", "event", "detail"))
    with pytest.raises(ValueError, match="closed"):
        for _ in range(2):
            log.write({"time": 1.0, "event": "timer", "detail": None})


def test_a_real_run_keeps_its_event_log_readable(tmp_path):
    result = jaxfl.run_experiment(jaxfl.RunConfig(algorithm="fedbuff", model="logreg", clients=4, local_steps=5,
                                                  max_updates=3, progress=False, output_dir=str(tmp_path)))
    run = load_run(result.run_dir)
    assert run.summary["global_updates"] == 3 and run.config["config"]["data"]["clients"] == 4
    assert run.metrics["version"].dtype == np.int64 and run.metrics["version"][-1] == 3
    with open(os.path.join(result.run_dir, "events.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert run.num_events == len(rows) > 0
    assert run.events["event"].tolist() == [row["event"] for row in rows]
    assert run.events["time"].tolist() == [float(row["time"]) for row in rows]
    assert np.sum(run.events["event"] == "aggregate") == 3
    # the same rows through EventLog give the same bytes as the run's own DictWriter
    copy = tmp_path / "copy"
    copy.mkdir()
    typed = [dict(zip(EVENT_LOG_FIELDS, values)) for values in zip(*(
        [None if (v == -1 and k not in ("client", "time")) or v != v else v for v in run.events[k].tolist()]
        for k in EVENT_LOG_FIELDS))]
    with EventLog(str(copy), format="csv") as log:
        for row in typed:
            log.write(row)
    assert (copy / "events.csv").read_bytes() == open(os.path.join(result.run_dir, "events.csv"), "rb").read()
    stats = timeline_stats(run.events, num_clients=4)
    assert stats["aggregations"] == 3 and 0 < stats["utilisation_mean"] <= 1
    assert sum(stats["arrival_staleness_histogram"].values()) == stats["arrivals"]


def test_a_loaded_run_s_config_runs_it_again_to_the_same_results(tmp_path):
    """``load_run(d).run_config`` is the run's RunConfig: run again it gives the same event log and
    metrics; a run naming a relative data file is refused from another folder, not read against it."""
    config = jaxfl.RunConfig(algorithm="fedcompass", model="mlp", clients=4, local_steps=4, max_updates=3,
                             progress=False, heterogeneity="exp", output_dir=str(tmp_path / "runs"))
    first = load_run(jaxfl.run_experiment(config).run_dir)
    assert first.run_config == jaxfl.validate(config)
    with pytest.warns(UserWarning, match="holds a finished run of this config"):  # and trains it again, in -2
        again = load_run(jaxfl.run_experiment(first.run_config).run_dir)
    assert again.run_dir != first.run_dir and os.path.dirname(again.run_dir) == os.path.dirname(first.run_dir)
    for name in ("time", "event", "client", "version", "staleness", "steps"):
        assert again.events[name].tolist() == first.events[name].tolist()
    assert again.metrics["accuracy"].tolist() == first.metrics["accuracy"].tolist()
    assert dataclasses.replace(first.run_config, seed=3).seed == 3

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = dict(first.config, working_directory=str(elsewhere))
    relative["config"] = {**first.config["config"], "data": {**first.config["config"]["data"],
                                                               "dataset": "npz", "data_dir": "mine.npz"}}
    with pytest.raises(ValueError, match=f"was started in '{elsewhere}' and its config names data_dir='mine.npz' "
                                         "relative to that folder"):
        dataclasses.replace(first, config=relative).run_config
    with pytest.raises(ValueError, match="holds no run config"):
        dataclasses.replace(first, config={}).run_config
    # a run of an earlier jaxfl: a setting it held unread, refused since, is left out (as a resume
    # leaves it); one this jaxfl refuses otherwise names the run and where its values are
    record = first.config["config"]
    unread = {**record, "engine": {**record["engine"], "batching": False, "clients_per_call": 2}}
    assert dataclasses.replace(first, config=dict(first.config, config=unread)).run_config.clients_per_call is None
    # FedAsync's paper rule mixes models without a server optimiser (an earlier jaxfl took a server_lr)
    refused = {**record, "algorithm": "fedasync", "algorithm_options": {},
               "server": {**record["server"], "rule": "paper", "server_lr": 0.5}}
    with pytest.raises(jaxfl.ConfigError, match=rf"run {re.escape(repr(first.run_dir))}: its recorded config is "
                                                r"refused by this jaxfl: server_lr=0\.5 is not allowed: .*an earlier "
                                                r"jaxfl may have taken this setting: its values are in "
                                                r"\.config\['config'\]"):
        dataclasses.replace(first, config=dict(first.config, config=refused)).run_config
    gone = {**record, "algorithm": "no_such_module_here:Mine", "algorithm_options": {}}  # a plug-in not importable
    with pytest.raises(jaxfl.ConfigError, match="refused by this jaxfl: .*no_such_module_here") as refused_plugin:
        dataclasses.replace(first, config=dict(first.config, config=gone)).run_config
    assert "earlier jaxfl" not in str(refused_plugin.value)  # nothing an earlier jaxfl took


def test_load_run_names_the_path_of_a_directory_that_is_no_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_run(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="neither events.csv nor events/"):
        read_events(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="metrics.csv"):
        read_metrics(str(tmp_path))


def test_to_pandas_says_how_to_install_pandas(monkeypatch):
    import sys

    from jaxfl.runlog import Run

    monkeypatch.setitem(sys.modules, "pandas", None)  # an import of pandas now fails
    with pytest.raises(ImportError, match="pip install pandas"):
        Run("r", {}, {}, {}, {}).to_pandas()


def test_to_pandas_marks_missing_integers():
    pandas = pytest.importorskip("pandas")
    run = jaxfl.runlog.Run("r", {}, {}, {"time": np.zeros(1)}, synthetic_events(clients=2, rounds=2))
    frame = run.to_pandas()
    assert frame["staleness"].isna().sum() == np.sum(run.events["staleness"] == -1) > 0
    assert frame["client"].dtype == np.int64 and isinstance(run.to_pandas("metrics"), pandas.DataFrame)


def test_empty_logs_read_as_empty_columns(tmp_path):
    for format in ("csv", "parquet"):
        (tmp_path / format).mkdir()
        EventLog(str(tmp_path / format), format=format).close()
        columns = read_events(str(tmp_path / format))
        assert set(columns) == set(EVENT_LOG_FIELDS) and all(len(v) == 0 for v in columns.values())
        stats = timeline_stats(columns, num_clients=3)
        assert stats["aggregations"] == 0 and stats["utilisation_mean"] is None


# --------------------------------------------------------------------------- Parquet and the switch
def test_auto_switches_to_parquet_and_reads_back_what_was_written(tmp_path):
    columns = synthetic_events(clients=50, rounds=40)
    with EventLog(str(tmp_path), switch_rows=1000, part_rows=1500, buffer_rows=256) as log:
        for row in rows_of(columns):
            log.write(row)
        assert log.format == "parquet"
    assert not (tmp_path / "events.csv").exists()
    parts = sorted(os.listdir(tmp_path / "events"))
    total = len(columns["time"])
    assert parts == [f"part-{i:05d}.parquet" for i in range(-(-total // 1500))]  # one per part_rows rows
    assert_same_columns(read_events(str(tmp_path)), columns)


def test_explicit_formats(tmp_path):
    columns = synthetic_events(clients=5, rounds=10)
    for format in ("csv", "parquet"):
        folder = tmp_path / format
        folder.mkdir()
        with EventLog(str(folder), format=format, switch_rows=1) as log:
            for row in rows_of(columns):
                log.write(row)
        assert event_log_format(str(folder)) == format  # "csv" never switches
        assert_same_columns(read_events(str(folder)), columns)
    with pytest.raises(ValueError, match="format='json' is not allowed"):
        EventLog(str(tmp_path), format="json")


def _parquet_table(run_dir):
    import pyarrow.parquet as pq

    folder = os.path.join(run_dir, "events")
    parts = sorted(os.listdir(folder))
    return parts, pq.ParquetDataset([os.path.join(folder, name) for name in parts]).read()


def test_expected_rows_beyond_the_switch_start_in_parquet_with_the_parts_a_switch_writes(tmp_path):
    columns = synthetic_events(clients=30, rounds=30)
    total = len(columns["time"])
    options = dict(switch_rows=500, part_rows=400, buffer_rows=64)
    for name, expected in (("switched", None), ("told", 501), ("small", 500)):
        (tmp_path / name).mkdir()
        with EventLog(str(tmp_path / name), expected_rows=expected, **options) as log:
            assert log.format == ("parquet" if name == "told" else "csv")  # "small": not more than the switch
            assert os.path.exists(tmp_path / name / "events.csv") == (name != "told")
            for row in rows_of(columns):
                log.write(row)
        assert event_log_format(str(tmp_path / name)) == "parquet" and not (tmp_path / name / "events.csv").exists()
    switched_parts, switched = _parquet_table(str(tmp_path / "switched"))
    told_parts, told = _parquet_table(str(tmp_path / "told"))
    assert told_parts == switched_parts == [f"part-{i:05d}.parquet" for i in range(-(-total // 400))]
    assert told.schema.equals(switched.schema, check_metadata=False)
    for name in told.column_names:  # the same values (dictionaries may be ordered otherwise)
        assert told[name].to_pylist() == switched[name].to_pylist(), name
    assert_same_columns(read_events(str(tmp_path / "told")), columns)
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match="expected_rows=-1 is not allowed"):
        EventLog(str(tmp_path / "bad"), expected_rows=-1)
    assert os.listdir(tmp_path / "bad") == []  # refused before any file


def test_a_large_timing_only_run_writes_its_log_in_parquet_from_the_start(tmp_path):
    """(2 x buffer_size + 1) x max_updates = 21 x 10,000 rows expected: past the 200,000-row switch."""
    from jaxfl.algorithms import build
    from jaxfl.config import validate
    from jaxfl.experiment import _expected_event_rows

    config = jaxfl.RunConfig(algorithm="fedbuff", dataset="synthetic_iid", partition="natural", model="logreg",
                             clients=100, concurrency=20, buffer_size=10, max_updates=10_000, max_time=float("inf"),
                             timing_only=True, progress=False, output_dir=str(tmp_path))
    result = jaxfl.run_experiment(config)
    assert event_log_format(result.run_dir) == "parquet"
    assert sorted(os.listdir(result.run_dir + "/events")) == ["part-00000.parquet"]  # never a CSV to convert
    run = load_run(result.run_dir)
    kinds = dict(zip(*np.unique(run.events["event"], return_counts=True)))
    assert kinds["aggregate"] == run.summary["global_updates"] == 10_000
    assert kinds["arrival"] >= 10 * 10_000 and kinds["dispatch"] >= kinds["arrival"]
    assert run.num_events >= _expected_event_rows(config, build(validate(config)).policy()) == 210_000
    assert _expected_event_rows(dataclasses.replace(config, timing_only=False)) is None  # a training run: CSV first


def test_frequent_flushes_leave_few_parts(tmp_path):
    columns = synthetic_events(clients=20, rounds=50)
    with EventLog(str(tmp_path), format="parquet", part_rows=1000, buffer_rows=64, flush_seconds=0) as log:
        for index, row in enumerate(rows_of(columns)):
            log.write(row)
            if index % 7 == 0:
                log.flush()
                if index % 700 == 0:
                    assert len(os.listdir(tmp_path / "events")) <= 1 + 10 + 12  # full parts + O(log) small
    assert len(os.listdir(tmp_path / "events")) == -(-len(columns["time"]) // 1000)  # merged on close
    assert_same_columns(read_events(str(tmp_path)), columns)


def test_parquet_flushes_are_rate_limited_but_positions_are_exact(tmp_path):
    rows = list(rows_of(synthetic_events(clients=4, rounds=10)))
    with EventLog(str(tmp_path), format="parquet", flush_seconds=3600) as log:
        for row in rows[:30]:
            log.write(row)
        log.flush()  # within the hour: nothing written yet
        assert len(read_events(str(tmp_path))["time"]) == 0
        log.flush(force=True)
        assert len(read_events(str(tmp_path))["time"]) == 30
        for row in rows[30:]:
            log.write(row)
        assert log.position()["rows"] == len(read_events(str(tmp_path))["time"]) == len(rows)


def test_a_merge_interrupted_before_deleting_leaves_no_doubled_rows(tmp_path):
    columns = synthetic_events(clients=4, rounds=10)
    rows = list(rows_of(columns))
    log = EventLog(str(tmp_path), format="parquet", part_rows=1000, buffer_rows=8, flush_seconds=0)
    for row in rows[:20]:
        log.write(row)
    log.flush()  # part 0: rows 0-19
    events = tmp_path / "events"
    for row in rows[20:40]:
        log.write(row)
    shutil.copy(events / "part-00000.parquet", tmp_path / "old-part")
    log.flush()  # merged: part 0 holds rows 0-39
    shutil.copy(tmp_path / "old-part", events / "part-00001.parquet")  # a leftover the crash did not delete
    assert read_events(str(tmp_path))["time"].tolist() == columns["time"][:40].tolist()
    position = log.position()
    resumed = EventLog(str(tmp_path), resume=position, part_rows=1000)
    assert sorted(os.listdir(events)) == ["part-00000.parquet"]  # the leftover is cleaned up
    for row in rows[40:]:
        resumed.write(row)
    resumed.close()
    assert_same_columns(read_events(str(tmp_path)), columns)


# --------------------------------------------------------------------------- resume
def _resume_case(tmp_path, checkpoint_at: int, crash_at: int, **options):
    """Write to ``crash_at`` rows with a checkpoint at ``checkpoint_at``, crash (no close), resume,
    write the rest: the log must equal an uninterrupted one."""
    columns = synthetic_events(clients=30, rounds=30)
    rows = list(rows_of(columns))
    log = EventLog(str(tmp_path), **options)
    position = None
    for index, row in enumerate(rows[:crash_at]):
        if index == checkpoint_at:
            position = log.position()
        log.write(row)
    log.flush()  # what the crash leaves: every row up to it on disk, none after
    formats = (position["format"], log.format)
    resumed = EventLog(str(tmp_path), resume=position, **options)
    assert resumed.rows == checkpoint_at
    assert read_events(str(tmp_path))["time"].tolist() == columns["time"][:checkpoint_at].tolist()
    for row in rows[checkpoint_at:]:
        resumed.write(row)
    resumed.close()
    assert_same_columns(read_events(str(tmp_path)), columns)
    return formats


def test_resume_cuts_back_a_csv_log(tmp_path):
    assert _resume_case(tmp_path, 300, 700, format="csv") == ("csv", "csv")
    rows = list(rows_of(synthetic_events(clients=30, rounds=30)))
    assert (tmp_path / "events.csv").read_bytes() == dictwriter_bytes(rows)


def test_resume_cuts_back_a_parquet_log_inside_a_part(tmp_path):
    assert _resume_case(tmp_path, 650, 1300, format="parquet", part_rows=400, buffer_rows=64) == ("parquet", "parquet")


def test_resume_across_a_switch_made_after_the_checkpoint(tmp_path):
    formats = _resume_case(tmp_path, 300, 1500, format="auto", switch_rows=500, part_rows=400, buffer_rows=64)
    assert formats == ("csv", "parquet")
    assert not (tmp_path / "events.csv").exists()


def test_resume_from_an_old_checkpoint_byte_offset(tmp_path):
    rows = list(rows_of(synthetic_events(clients=3, rounds=4)))
    with EventLog(str(tmp_path), format="csv") as log:
        for row in rows[:5]:
            log.write(row)
        offset = log.position()["bytes"]
        for row in rows[5:]:
            log.write(row)
    with EventLog(str(tmp_path), format="csv", resume=offset) as log:
        assert log.rows == 5
        for row in rows[5:]:
            log.write(row)
    assert (tmp_path / "events.csv").read_bytes() == dictwriter_bytes(rows)


# --------------------------------------------------------------------------- scale
def test_a_million_rows_round_trip(tmp_path):
    columns = synthetic_events(clients=20_000, rounds=25)  # 10^6 dispatch/arrival rows + aggregations
    total = len(columns["time"])
    assert total > 1_000_000
    with EventLog(str(tmp_path), switch_rows=100_000, part_rows=1 << 18) as log:
        for row in rows_of(columns):
            log.write(row)
    assert not (tmp_path / "events.csv").exists()
    assert len(os.listdir(tmp_path / "events")) == -(-total // (1 << 18))
    assert_same_columns(read_events(str(tmp_path)), columns)


# --------------------------------------------------------------------------- statistics
def test_timeline_stats_of_a_synthetic_schedule():
    columns = synthetic_events(clients=100, rounds=20, buffer_size=10)
    stats = timeline_stats(columns)
    assert stats["clients"] == 100 and stats["dispatches"] == stats["arrivals"] == 2000
    assert stats["aggregations"] == 200
    # clients train back to back until their last round: busy until then, idle after it
    last_end = {}
    for c, t, e in zip(columns["client"], columns["time"], columns["event"]):
        if e == "arrival":
            last_end[c] = t
    horizon = columns["time"].max()
    assert stats["idle_client_s_total"] == pytest.approx(sum(horizon - t for t in last_end.values()))
    assert stats["idle_gap_mean_s"] == pytest.approx(0.0, abs=1e-9)
    expected = np.bincount(columns["staleness"][columns["event"] == "arrival"])
    assert stats["arrival_staleness_histogram"] == {str(s): int(n) for s, n in enumerate(expected) if n}
    assert stats["aggregations_per_hour"] == pytest.approx(200 * 3600 / horizon)
    assert stats["arrival_staleness_mean"] == pytest.approx(columns["staleness"][columns["event"] == "arrival"].mean())


def test_timeline_stats_bins_a_wide_staleness_range_and_counts_overlaps_once():
    time = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
    events = {"time": time, "event": np.array(["dispatch", "dispatch", "arrival", "arrival", "timer"], object),
              "client": np.array([0, 0, 0, 0, -1]), "dispatch": np.array([0, 1, 1, 0, -1]),
              "staleness": np.array([-1, -1, 0, 1, -1])}
    stats = timeline_stats(events, num_clients=2)
    assert stats["utilisation_mean"] == pytest.approx(2.0 / 8.0)  # client 0 busy [0, 2] once; client 1 never
    assert stats["idle_client_s_total"] == pytest.approx(6.0)
    wide = {"time": np.arange(300.0), "event": np.full(300, "arrival", object), "client": np.zeros(300, int),
            "dispatch": np.full(300, -1), "staleness": np.arange(300)}
    histogram = timeline_stats(wide)["arrival_staleness_histogram"]
    assert histogram["0"] == 1 and histogram["1"] == 1 and histogram["2-3"] == 2 and histogram["256-511"] == 44
    assert sum(histogram.values()) == 300


def test_a_finished_run_on_other_speeds_is_not_called_a_run_of_this_config(tmp_path):
    """Given speeds (``time_per_step``) are not in a run's name: a run on other speeds gets the same
    folder name with -2, and no note that a finished run of this config is there; the same speeds again get it."""
    import warnings

    config = jaxfl.RunConfig(algorithm="fedasync", model="mlp", clients=3, local_steps=2, max_updates=4,
                             progress=False, timing_only=True, output_dir=str(tmp_path / "runs"))
    first = jaxfl.run_experiment(config, time_per_step=[0.1, 0.2, 0.3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "holds a finished run of this config"
        other = jaxfl.run_experiment(config, time_per_step=[0.3, 0.2, 0.1])
    assert other.run_dir == first.run_dir + "-2"
    assert load_run(other.run_dir).events["time"].tolist() != load_run(first.run_dir).events["time"].tolist()
    with pytest.warns(UserWarning, match=rf"{re.escape(first.run_dir)} holds a finished run of this config"):
        again = jaxfl.run_experiment(config, time_per_step=[0.1, 0.2, 0.3])
    assert again.run_dir == first.run_dir + "-3"


def test_a_finished_run_of_an_older_jaxfl_given_a_loss_is_still_called_a_run_of_this_config(tmp_path):
    """config.json's user_inputs gained loss_probe (and model_settings) on 2026-12-05: a run recorded
    without them is still this config's, where every key it has agrees."""
    import json

    import optax

    loss = optax.softmax_cross_entropy_with_integer_labels
    config = jaxfl.RunConfig(algorithm="fedasync", model="mlp", clients=3, local_steps=2, max_updates=2,
                             progress=False, output_dir=str(tmp_path / "runs"))
    first = jaxfl.run_experiment(config, loss=loss)
    path = os.path.join(first.run_dir, "config.json")
    record = json.load(open(path))
    assert len(record["user_inputs"].pop("loss_probe")) == 4
    json.dump(record, open(path, "w"))
    with pytest.warns(UserWarning, match=rf"{re.escape(first.run_dir)} holds a finished run of this config"):
        jaxfl.run_experiment(config, loss=loss)

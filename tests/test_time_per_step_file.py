"""``load_time_per_step`` (``jaxfl run --time-per-step FILE``): one column or one row of numbers is
read as the clients' seconds per step; anything else is refused in one line naming the file, what it
holds and what is allowed. A two-column CSV (device ids, then times) was read as ids and times
interleaved, and a run with twice as many clients went on with those as its speeds."""
import numpy as np
import pytest

from jaxfl.cli import main
from jaxfl.user_inputs import load_time_per_step

TIMES = [0.12, 0.25, 0.31, 0.47]


@pytest.mark.parametrize("text", [
    "0.12\n0.25\n0.31\n0.47\n",                       # one number per line
    "seconds_per_step\n0.12\n0.25\n0.31\n0.47\n",     # ... after a header
    "\n0.12\n\n0.25\r\n0.31\n0.47",                  # blank lines, CRLF, no final newline
    "0.12,0.25,0.31,0.47\n",                         # one row, commas
    "0.12 0.25 0.31 0.47\n",                         # one row, spaces (was taken for a header: [])
    "0.12\t0.25\t0.31\t0.47\n",                      # one row, tabs
    "0.12, 0.25 ,0.31,\t0.47,\n",                    # mixed separators, a trailing comma
    "c0\tc1\tc2\tc3\n0.12\t0.25\t0.31\t0.47\n",      # one row under a header naming the clients
    "\ufeffseconds\n0.12\n0.25\n0.31\n0.47\n",       # Excel's byte-order mark before a header
])
def test_one_column_or_one_row_is_read_as_the_times(tmp_path, text):
    path = tmp_path / "speeds.csv"
    path.write_text(text, encoding="utf-8")
    times = load_time_per_step(str(path))
    assert times.dtype == np.float64
    np.testing.assert_array_equal(times, TIMES)


def test_a_byte_order_mark_does_not_drop_the_first_client(tmp_path):
    # without a header, the mark made the first number look like one and the first client vanished
    path = tmp_path / "speeds.txt"
    path.write_text("\ufeff0.12\n0.25\n0.31\n0.47\n", encoding="utf-8")
    np.testing.assert_array_equal(load_time_per_step(path), TIMES)


def refusal(path, text: str) -> str:
    """The one-line ValueError that load_time_per_step gives for a file holding ``text``, checked to
    name the file and the layouts allowed."""
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        load_time_per_step(str(path))
    message = str(refused.value)
    assert "\n" not in message and repr(str(path)) in message and "one number per line" in message
    return message


def test_npy_files_are_read_as_before(tmp_path):
    path = tmp_path / "speeds.npy"
    np.save(path, np.array(TIMES))
    np.testing.assert_array_equal(load_time_per_step(str(path)), TIMES)


@pytest.mark.parametrize("text, found", [
    ("device,speed\n1,0.12\n2,0.25\n3,0.31\n4,0.47\n", "(4 rows of 2 columns)"),  # no column named for the times
    ("1,0.12\n2,0.25\n3,0.31\n", "(3 rows of 2 columns)"),
    ("0.1\t0.2\t0.3\n0.4\t0.5\t0.6\n", "(2 rows of 3 columns)"),
    ("phone-a 0.12\nphone-b 0.25\n", "(2 rows of 2 columns)"),  # a table, not a 'bad number'
    ("0.1\n0.2,0.3\n", "(2 rows of 1 to 2 columns)"),
    # one client's row under a header naming an id column: was read as 2 clients, the id client 0's time
    ("client_id,seconds\n1,0.12\n", "(1 row of 2 columns, the first headed 'client_id'"),
    ("Device ID\tspp\n7\t0.12\n", "(1 row of 2 columns, the first headed 'Device'"),
])
def test_a_table_of_several_columns_is_refused_naming_its_shape(tmp_path, text, found):
    message = refusal(tmp_path / "speeds.csv", text)
    assert found in message and "one row of numbers" in message
    if "rows of" in found:  # what would make the table readable
        assert "a table whose header names a column time_per_step or seconds_per_step" in message
    assert message.endswith("keep only the seconds-per-step column")


@pytest.mark.parametrize("text, said", [
    ("", "is empty"),
    ("\n  \n\t\n", "is empty"),
    ("seconds_per_step\n", "holds a header line and no numbers"),
    ("seconds\n0.1\nfast\n0.3\n", "line 3: 'fast' is not a number"),
    ("0.1,,0.3\n", "line 1: an empty field is not a number"),  # a missing value would shift the clients
])
def test_empty_or_non_numeric_files_are_refused_in_one_line(tmp_path, text, said):
    assert said in refusal(tmp_path / "speeds.txt", text)


def test_a_missing_file_or_another_suffix_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"speeds\.csv' does not exist"):
        load_time_per_step(str(tmp_path / "speeds.csv"))
    other = tmp_path / "speeds.json"
    other.write_text("[0.1, 0.2]")
    with pytest.raises(ValueError, match=r"speeds\.json' must end in \.npy, \.csv or \.txt"):
        load_time_per_step(str(other))


def test_the_cli_refuses_a_two_column_csv_before_any_work(tmp_path, capsys):
    # 8 clients: the 8 interleaved ids and times used to pass the length check and the run went on
    path = tmp_path / "speeds.csv"
    path.write_text("device,seconds\n1,0.12\n2,0.25\n3,0.31\n4,0.47\n")
    with pytest.raises(SystemExit) as exited:
        main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "8", "--local-steps", "2",
              "--max-updates", "2", "--time-per-step", str(path), "--no-progress",
              "--output-dir", str(tmp_path / "runs")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(4 rows of 2 columns)" in err and "seconds-per-step column" in err
    assert not (tmp_path / "runs").exists()


def test_the_cli_runs_with_a_whitespace_separated_row(tmp_path):
    (tmp_path / "speeds.txt").write_text("0.5 0.25 0.125\n")
    assert main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                 "--max-updates", "2", "--time-per-step", str(tmp_path / "speeds.txt"), "--jitter", "0",
                 "--no-progress", "--output-dir", str(tmp_path / "runs"), "--run-name", "row"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "runs" / "row" / "client_time_per_step.npy"),
                                  [0.5, 0.25, 0.125])


def test_a_comparison_on_other_speeds_is_run_again_not_reused(tmp_path, capsys):
    """The same comparison with another --time-per-step file in the same --out reused the finished
    runs of the first speeds ("reused: it had finished", their virtual times); their summaries said
    heterogeneity exp, the model the given times replaced."""
    import json
    import os

    (tmp_path / "fast.csv").write_text("0.1\n0.1\n0.1\n0.1\n")
    (tmp_path / "slow.csv").write_text("5\n5\n5\n5\n")

    def compare(speeds):
        assert main(["run", "--timing-only", "--algorithm", "fedavg,fedbuff", "--clients", "4", "--jitter", "0",
                     "--local-steps", "10", "--max-updates", "2", "--time-per-step", str(tmp_path / speeds),
                     "--output-dir", str(tmp_path / "cmp"), "--no-progress"]) == 0
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("fedavg")][0]

    assert "in 2 virtual s" in compare("fast.csv")
    slow = compare("slow.csv")
    assert "in 100 virtual s" in slow and "reused" not in slow
    again = compare("fast.csv")  # the first speeds again: their finished runs
    assert "in 2 virtual s" in again and again.endswith("(reused: it had finished)")
    summaries = [json.loads((tmp_path / "cmp" / name / "summary.json").read_text())
                 for name in os.listdir(tmp_path / "cmp")]
    assert len(summaries) == 4 and {summary["heterogeneity"] for summary in summaries} == {"given"}


def test_a_run_s_config_json_runs_again_on_the_speeds_the_run_was_given(tmp_path, capsys):
    """`jaxfl run --config RUN/config.json` re-runs a run; one given --time-per-step drew its speeds
    from the exp model instead, under the same name (75 updates in 60 s against 252), saying nothing."""
    import json

    (tmp_path / "speeds.csv").write_text("0.1\n0.2\n0.3\n0.4\n")
    common = ["--no-progress", "--run-name", "run"]
    assert main(["run", "--timing-only", "--algorithm", "fedbuff", "--clients", "4", "--jitter", "0",
                 "--local-steps", "5", "--max-time", "20", "--time-per-step", str(tmp_path / "speeds.csv"),
                 "--output-dir", str(tmp_path / "first"), *common]) == 0
    record = tmp_path / "first" / "run" / "config.json"
    assert main(["run", "--config", str(record), "--output-dir", str(tmp_path / "again"), *common]) == 0
    assert "seconds per step that the run was given are used again" in capsys.readouterr().err
    first, again = (json.loads((tmp_path / where / "run" / "summary.json").read_text()) for where in ("first", "again"))
    assert again["heterogeneity"] == "given" and again["global_updates"] == first["global_updates"]
    from jaxfl.testing import events_without_wall_time

    assert events_without_wall_time(tmp_path / "again" / "run") == events_without_wall_time(tmp_path / "first" / "run")
    # a flag that draws speeds instead: the run's are not used, and that is said (it was refused)
    assert main(["run", "--config", str(record), "--heterogeneity", "normal", "--output-dir", str(tmp_path / "drawn"),
                 *common]) == 0
    assert "--heterogeneity draws them" in capsys.readouterr().err
    assert json.loads((tmp_path / "drawn" / "run" / "summary.json").read_text())["heterogeneity"] == "normal"
    # gone, or not the array recorded: refused before any work, naming the flag that gives them
    np.save(tmp_path / "first" / "run" / "client_time_per_step.npy", np.array([0.1, 0.2, 0.3, 0.5]))
    for _ in range(2):
        with pytest.raises(SystemExit) as exited:
            main(["run", "--config", str(record), "--output-dir", str(tmp_path / "third"), *common])
        assert exited.value.code == 2 and "--time-per-step FILE" in capsys.readouterr().err
        assert not (tmp_path / "third").exists()
        (tmp_path / "first" / "run" / "client_time_per_step.npy").unlink(missing_ok=True)


def test_clipped_jittered_times_are_floored_below_the_fastest_given_time_not_at_a_fraction_of_mu():
    """The floor was 0.01·μ, μ the speed model's mean (0.15 s by default, unread with given times):
    clients given 1.0, 0.5 and 0.1 ms per step all ran at 1.5 ms."""
    from jaxfl.scheduler.speeds import ClientSpeeds, SpeedConfig

    given = [0.001, 0.0005, 0.002, 0.0001]
    speeds = ClientSpeeds(SpeedConfig(jitter=0.01, negative="clip"), 4, seed=0, time_per_step=given)
    for client, time in enumerate(given):
        drawn = [speeds.round_duration(client, 1) for _ in range(50)]
        assert np.allclose(drawn, time, rtol=0.06), (client, time, drawn[:3])


def read_with_notes(path, text: str):
    """load_time_per_step of a file holding ``text``, and the warnings it gave."""
    import warnings

    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        times = load_time_per_step(str(path))
    return times, [str(warning.message) for warning in caught]


@pytest.mark.parametrize("text", [
    "client_id,seconds_per_step\n0,0.12\n1,0.25\n2,0.31\n3,0.47\n",   # in id order
    "client_id,seconds_per_step\n3,0.47\n1,0.25\n0,0.12\n2,0.31\n",   # shuffled: ordered by id
    "Client-ID\tTime_Per_Step\n4\t0.47\n2\t0.25\n1\t0.12\n3\t0.31\n",  # 1-based ids, other spellings
    "time-per-step,id\n0.12,1\n0.31,3\n0.25,2\n0.47,4\n",             # the id column after the times
    "seconds_per_step\t\n0.12\n0.25\n0.31\n0.47\n",                  # a header with a trailing separator
])
def test_a_trace_table_is_read_by_its_column_names_in_client_id_order(tmp_path, text):
    times, notes = read_with_notes(tmp_path / "trace.csv", text)
    np.testing.assert_array_equal(times, TIMES)
    assert notes == []


def test_a_trace_table_without_ids_is_read_in_file_order_naming_the_columns_not_read(tmp_path):
    # a FedScale-like device trace: its seconds per step and its bandwidth (kbit/s, in bytes per
    # second) shape the run; its device column is named, not silently dropped
    times, notes = read_with_notes(tmp_path / "trace.csv", "device,seconds_per_step,bandwidth_kbps\n"
                                   "phone-a,0.12,900\nphone-b,0.25,120\nphone-c,0.31,4000\nphone-d,0.47,50\n")
    np.testing.assert_array_equal(times["time_per_step"], TIMES)
    np.testing.assert_array_equal(times["bandwidth"], [112_500, 15_000, 500_000, 6_250])
    assert len(notes) == 1
    assert notes[0].endswith("read columns 'seconds_per_step', 'bandwidth_kbps'; not read: 'device'")
    times, notes = read_with_notes(tmp_path / "trace.csv", "client,time_per_step,os\n1,0.25,ios\n0,0.12,android\n")
    np.testing.assert_array_equal(times, [0.12, 0.25])
    assert notes[0].endswith("read column 'time_per_step' in the order of 'client'; not read: 'os'")


@pytest.mark.parametrize("text, said", [
    ("client_id,seconds_per_step\n0,0.12\n0,0.25\n", "client id 0 is on lines 2 and 3 (column 'client_id'): each "
                                                       "client needs one row"),
    ("client_id,seconds_per_step\n0.5,0.12\n1,0.25\n", "line 2, column 'client_id': '0.5' is not an integer client id"),
    ("client_id,seconds_per_step\nc0,0.12\n", "line 2, column 'client_id': 'c0' is not a number"),
    ("client_id,seconds_per_step,os\n0,,ios\n", "line 2, column 'seconds_per_step': an empty field is not a number"),
    ("client_id,seconds_per_step\n0,\n", "line 2, column 'seconds_per_step': an empty field is not a number"),
    ("client_id,seconds_per_step,os\n0,0.1\n", "line 2: 2 fields under a header of 3 columns"),
    ("client_id,seconds_per_step,x\n0,0.1\n", "line 2: 2 fields under a header of 3 columns (client_id, "
                                              "seconds_per_step, x)"),
    ("id,client,seconds_per_step\n0,0,0.1\n", "has 2 columns of client ids ('id', 'client'): keep one"),
    ("time_per_step,seconds_per_step\n0.1,0.1\n", "has 2 columns of seconds per step ('time_per_step', "
                                                  "'seconds_per_step'): keep one"),
])
def test_a_trace_table_that_cannot_be_read_is_refused_in_one_line(tmp_path, text, said):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as refused:
        load_time_per_step(str(path))
    message = str(refused.value)
    assert "\n" not in message and repr(str(path)) in message and said in message


@pytest.mark.parametrize("text", [
    # names and values with spaces, quoted fields, an empty last column: a CSV reader's fields (the
    # header was split at spaces too: "bandwidth kbps" made one column two, and the table was refused;
    # a bandwidth column is read now, so another column with a space stands in for it)
    'client id,seconds per step,device\n1,0.25,Pixel 7\n0,0.12,"Galaxy, S21"\n3,0.47,\n2,0.31,iPhone 13\n',
    '"client_id","time_per_step","signal dBm"\n"0","0.12","-90"\n"1","0.25","-120"\n"2","0.31",""\n"3","0.47","-50"\n',
    "Client ID\tSeconds per step\tOS\n0\t0.12\tAndroid 14\n1\t0.25\tiOS\n2\t0.31\t\n3\t0.47\tiOS\n",
])
def test_a_trace_table_is_split_as_a_csv_reader_splits_it(tmp_path, text):
    times, notes = read_with_notes(tmp_path / "trace.csv", text)
    np.testing.assert_array_equal(times, TIMES)
    assert len(notes) == 1 and "not read: " in notes[0] and "not consecutive" not in notes[0]


def test_client_ids_with_gaps_are_numbered_in_order_with_a_note_and_large_ids_compared_exactly(tmp_path):
    """Ids 0, 10, 20, 30 became clients 0-3 without a word; ids past 2^53 were compared as floats, and
    two of them refused as one id given twice."""
    times, notes = read_with_notes(tmp_path / "trace.csv", "client_id,seconds_per_step\n20,0.31\n0,0.12\n30,0.47\n"
                                                           "10,0.25\n")
    np.testing.assert_array_equal(times, TIMES)
    assert notes == [f"time_per_step file {str(tmp_path / 'trace.csv')!r}: read column 'seconds_per_step' in the "
                     "order of 'client_id'; its client ids are not consecutive: clients are numbered in id order "
                     "(id 0 is client 0, id 10 is client 1, id 20 is client 2, ...)"]
    times, notes = read_with_notes(tmp_path / "trace.csv", "id,time_per_step\n9007199254740993,0.25\n"
                                                           "9007199254740992,0.12\n")
    np.testing.assert_array_equal(times, [0.12, 0.25])
    assert notes == []


def test_the_cli_says_which_columns_it_did_not_read_as_a_note(tmp_path):
    import subprocess
    import sys

    (tmp_path / "trace.csv").write_text("client_id,seconds_per_step,bandwidth\n1,0.25,1e6\n0,0.5,2e6\n")
    done = subprocess.run([sys.executable, "-m", "jaxfl", "run", "--timing-only", "--algorithm", "fedavg",
                           "--clients", "2", "--max-updates", "1", "--time-per-step", str(tmp_path / "trace.csv"),
                           "--no-progress", "--output-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"jaxfl: note: time_per_step file {str(tmp_path / 'trace.csv')!r}: read column 'seconds_per_step' in " \
           "the order of 'client_id'; not read: 'bandwidth' (to read 'bandwidth' as each client's bandwidth, name its " \
           "unit: bandwidth_bytes_per_s, bandwidth_kbps or bandwidth_mbps (bits))\n" in done.stderr


def test_the_cli_runs_on_a_trace_table_and_says_which_columns_it_did_not_read(tmp_path):
    (tmp_path / "trace.csv").write_text("client_id,seconds_per_step,bandwidth\n2,0.125,1e6\n0,0.5,2e6\n1,0.25,3e6\n")
    with pytest.warns(UserWarning, match="in the order of 'client_id'; not read: 'bandwidth'"):
        assert main(["run", "--algorithm", "fedavg", "--model", "logreg", "--clients", "3", "--local-steps", "2",
                     "--max-updates", "2", "--time-per-step", str(tmp_path / "trace.csv"), "--jitter", "0",
                     "--no-progress", "--output-dir", str(tmp_path / "runs"), "--run-name", "trace"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "runs" / "trace" / "client_time_per_step.npy"),
                                  [0.5, 0.25, 0.125])


@pytest.mark.parametrize("text", [
    "client_id,time_per_step\n0,0.12,\n1,0.25,\n2,0.31,\n3,0.47,\n",           # a comma after every row
    "client_id,time_per_step,\n0,0.12,\n1,0.25,\n2,0.31,\n3,0.47,\n",          # ... and after the header
    "client_id\ttime_per_step\t\n0\t0.12\t\n1\t0.25\t\n2\t0.31\t\n3\t0.47\t\n",  # a tab after every line
    "client_id;time_per_step\n0;0,12\n1;0,25\n2;0,31\n3;0,47\n",               # a European spreadsheet's
])
def test_a_trace_table_s_trailing_separators_and_european_decimals_are_read(tmp_path, text):
    times, notes = read_with_notes(tmp_path / "trace.csv", text)
    np.testing.assert_array_equal(times, TIMES)
    assert notes == []


def test_a_trace_table_s_header_alone_is_said_as_such(tmp_path):
    # was an IndexError traceback (with an id column) or "shape (0,)" after a note
    for text in ("client_id,time_per_step\n", "time_per_step,os\n"):
        assert "holds a header line and no numbers" in refusal(tmp_path / "trace.csv", text)

"""A sweep's results.parquet has one schema whatever its values: a column empty in every row (no run
reached the target; a timing-only sweep's accuracies; local_epochs where steps are counted) was typed
null by pyarrow, read by pandas as object, and the tables of two sweeps of one grid did not concatenate
("Unsupported cast from double to null")."""
import pytest

from jaxfl import cli
from jaxfl.report import read_results
from jaxfl.sweep import write_results

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_the_tables_of_a_timing_only_sweep_and_a_trained_one_concatenate(tmp_path):
    assert cli.main(["sweep", "--out", str(tmp_path / "timing"), "--algorithm", "fedavg,fedasync", "--clients", "3",
                     "--lr", "1,0.5", "--timing-only", "--max-updates", "3", "--no-progress"]) == 0
    timing = pq.read_table(tmp_path / "timing" / "results.parquet")
    for name in ("time_to_target", "final_accuracy", "best_accuracy", "last_tenth_accuracy", "target_accuracy",
                 "local_epochs"):
        assert timing.schema.field(name).type == pa.float64(), name
    assert timing.schema.field("client_steps_executed").type == pa.int64()
    assert timing.schema.field("client_lr").type == pa.float64()  # swept as 1 and 0.5
    trained = read_results(str(tmp_path / "timing"))  # the same rows with what a trained run fills in
    for row in trained:
        row.update(time_to_target=12.5, final_accuracy=0.5, best_accuracy=0.75, last_tenth_accuracy=0.5,
                   target_accuracy=0.8, client_steps_executed=30)
    (tmp_path / "trained").mkdir()
    write_results(trained, str(tmp_path / "trained"))
    other = pq.read_table(tmp_path / "trained" / "results.parquet")
    assert other.schema == timing.schema
    assert pa.concat_tables([timing, other]).num_rows == 8


def test_a_swept_setting_read_by_no_cell_is_typed_as_its_config_field(tmp_path):
    rows = [{"cell": 0, "algorithm": "fedavg", "concurrency": None, "fedbuff.buffer_size": None}]
    write_results(rows, str(tmp_path))
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.schema.field("concurrency").type == pa.int64()
    assert table.schema.field("fedbuff.buffer_size").type == pa.null()  # an option: no field to type it by

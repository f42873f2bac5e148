"""Files written whole or not at all, through ``runlog.written_atomically``: a write that fails half way
(a full disk) leaves no temporary file beside the one asked for, and the file that was there before is
kept as it was. These writers each had a hand-written rename of their own that left ``NAME.tmp``
behind (the class heatmap in another format than PNG and client_samples.npy on a full disk; a sweep's
results.parquet on any other error of its write).

The disk is made "full" for real, with a file-size limit (RLIMIT_FSIZE: a write past it fails with
EFBIG, as one on a full disk fails with ENOSPC)."""
import errno
import os
import resource
import signal

import numpy as np
import pytest

from jaxfl import runlog, sweep


@pytest.fixture
def file_size_limit():
    """Set the soft file-size limit for the test's writes; it and SIGXFSZ's handler are restored after."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    yield lambda size: resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)


def test_a_class_heatmap_in_svg_that_fills_the_disk_leaves_no_temporary_file(tmp_path, file_size_limit):
    from jaxfl.data.report import PartitionReport, plot_class_heatmap

    report = PartitionReport(np.arange(12).reshape(4, 3), "split")
    path = str(tmp_path / "split.svg")
    file_size_limit(1000)  # an SVG of this figure is tens of kB
    with pytest.raises(OSError) as raised:
        plot_class_heatmap(report, path)
    assert raised.value.errno == errno.EFBIG
    assert os.listdir(tmp_path) == []


def test_a_sweeps_parquet_table_whose_write_fails_keeps_the_one_before(tmp_path, monkeypatch):
    # a full disk's .tmp was removed by the sweep's own handler; any other error (EIO from a failing
    # disk, a network file system gone) left results.parquet.tmp beside the table
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [{"cell": "a", "algorithm": "fedavg", "final_accuracy": 0.5}]
    sweep.write_results(rows, str(tmp_path))
    before = (tmp_path / "results.parquet").read_bytes()

    def half_then_eio(table, where, **options):
        open(where, "wb").write(before[:10])
        raise OSError(errno.EIO, "Input/output error", where)

    monkeypatch.setattr(pq, "write_table", half_then_eio)
    with pytest.raises(OSError, match="Input/output error"):
        sweep.write_results(rows + [{"cell": "b", "algorithm": "fedasync", "final_accuracy": 0.25}], str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["results.csv", "results.parquet"]
    assert (tmp_path / "results.parquet").read_bytes() == before


def test_client_samples_that_fill_the_disk_leave_no_temporary_file(tmp_path, file_size_limit):
    file_size_limit(64)  # the .npy header alone is 128 bytes
    with pytest.raises(OSError) as raised:
        runlog.write_client_samples(str(tmp_path), np.arange(1000))
    assert raised.value.errno == errno.EFBIG
    assert os.listdir(tmp_path) == []

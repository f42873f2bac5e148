"""Every client's sample count is kept beside config.json as client_samples.npy (config.json holds its
count, total and digest, a few hundred bytes at any federation size); old run directories, whose
config.json lists the counts, stay readable and resumable."""
import json
import os

import numpy as np
import pytest

from jaxfl.experiment import prepare, resume_experiment, run_experiment
from jaxfl.runlog import CLIENT_SAMPLES_FILE, load_run
from jaxfl.testing import assert_same_run
from conftest import Interrupted, replace


def _config_json(run_dir):
    with open(os.path.join(run_dir, "config.json")) as handle:
        return json.load(handle)


def test_counts_are_a_file_and_a_digest_and_an_old_list_still_reads_and_resumes(small_config, crash_after_saves):
    config = replace(small_config, clients=6, client_sizes="lognormal", max_updates=3, checkpoint_every=1)
    expected = prepare(config)[2].counts
    disarm = crash_after_saves(2)
    with pytest.raises(Interrupted):
        run_experiment(replace(config, run_name="cut"))
    disarm()
    run_dir = os.path.join(config.output_dir, "cut")
    record = _config_json(run_dir)["client_samples"]
    assert record["clients"] == 6 and record["total"] == int(expected.sum()) and record["file"] == CLIENT_SAMPLES_FILE
    assert len(json.dumps(record)) < 200
    assert os.path.getsize(os.path.join(run_dir, CLIENT_SAMPLES_FILE)) <= 128 + 6 * 2  # header, then uint16 counts
    np.testing.assert_array_equal(load_run(run_dir).client_samples, expected)
    assert len(set(expected.tolist())) > 1  # lognormal sizes: the order of the counts is checked

    # the form older versions wrote: the list inline, no file; it reads the same and the run resumes
    written = _config_json(run_dir)
    written["client_samples"] = expected.tolist()
    with open(os.path.join(run_dir, "config.json"), "w") as handle:
        json.dump(written, handle, indent=2)
    os.remove(os.path.join(run_dir, CLIENT_SAMPLES_FILE))
    np.testing.assert_array_equal(load_run(run_dir).client_samples, expected)
    resumed = resume_experiment(run_dir)
    assert_same_run(resumed, run_experiment(replace(config, run_name="whole")))


def test_a_changed_counts_file_is_refused_naming_it(small_config):
    result = run_experiment(replace(small_config, clients=3, max_updates=1, checkpoint_every=None,
                                    final_checkpoint=False))
    counts = load_run(result.run_dir).client_samples
    np.save(os.path.join(result.run_dir, CLIENT_SAMPLES_FILE), counts + 1)
    with pytest.raises(ValueError, match="client_samples.npy does not match config.json's client_samples record"):
        load_run(result.run_dir).client_samples

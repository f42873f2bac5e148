"""Event logs of fixed small runs (one or more per algorithm and switch), recorded before the
plug-in refactor; the code must keep reproducing them exactly.

The goldens hold only the scheduler's view (times, clients, versions, staleness, steps), which is
plain float64 arithmetic on the virtual clock, so they are portable across machines; a change of
speeds, partition, policy or the way updates are selected shows up here. To record them anew after an
intended change: ``python tests/test_golden_runs.py --record`` (and say why in the commit)."""
import json
import os
import sys

import pytest

from jaxfl.algorithms import names
from jaxfl.config import config_from_mapping
from jaxfl.experiment import run_experiment
from jaxfl.testing import events_without_wall_time

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
BASE = {"dataset": "mnist10k", "model": "mlp", "clients": 4, "local_steps": 6, "batch_size": 16, "max_updates": 5,
        "stop_at_target": False, "progress": False, "heterogeneity": "exp", "checkpoint_every": None}
with open(os.path.join(GOLDEN, "configs.json")) as handle:
    CONFIGS = json.load(handle)


def run(name, output_dir):
    config = config_from_mapping({**BASE, **CONFIGS[name], "output_dir": str(output_dir), "run_name": name})
    return run_experiment(config)


# One golden per registered algorithm is checked by the conformance suite's uninterrupted run
# (tests/test_conformance.py); the variants (switches, presets, faults) are checked here.
VARIANTS = sorted(name for name in CONFIGS if name not in names())


@pytest.mark.parametrize("name", VARIANTS)
def test_event_log_matches_the_golden_file(tmp_path, name):
    result = run(name, tmp_path)
    with open(os.path.join(GOLDEN, f"{name}.csv")) as old:  # the goldens predate the wall-clock column
        assert events_without_wall_time(result.run_dir) == old.read()


if __name__ == "__main__" and "--record" in sys.argv:
    import shutil
    import tempfile

    folder = tempfile.mkdtemp()
    for name in CONFIGS:
        shutil.copy(os.path.join(run(name, folder).run_dir, "events.csv"), os.path.join(GOLDEN, f"{name}.csv"))
        print("recorded", name)

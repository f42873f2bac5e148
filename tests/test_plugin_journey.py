"""A researcher's own algorithm, from a file, through config files, sweeps and its own mistakes
(found by following the README's "Adding an algorithm" with a new plug-in): a sweep or config file
that names the plug-in reads its option tables; a plug-in that does not import is named, not its
options called unknown; its validate's refusal is bad input (one line, status 2); an exception in its
policy names the file, line and sweep cell; a policy without start() is refused up front; a plug-in
file imports the modules beside it; a parallel sweep refuses an algorithm registered in the session."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "age_norm_fedbuff.py")
SMALL = ["--model", "mlp", "--clients", "4", "--local-steps", "2", "--batch-size", "16", "--max-updates", "4",
         "--no-progress"]

PLUGIN = '''
from jaxfl.algorithms import Algorithm
from jaxfl.scheduler.simulation import Policy
from helpers_beside import STEPS  # a module beside the plug-in file


class RaisingPolicy(Policy):
    def __init__(self):
        self.local_steps = STEPS

    def start(self, sim):
        sim.dispatch_many(range(sim.num_clients), self.local_steps)

    def on_arrival(self, sim, record):
        sim.aggregate([(record.id, 0.5)])
        sim.reply(record.client)
        if sim.version == 2:
            raise RuntimeError("boom in my policy")


class NoStartPolicy(Policy):
    def on_arrival(self, sim, record):
        pass


class Raising(Algorithm):
    name = "raising_journey"
    reads = frozenset()

    def policy(self):
        return RaisingPolicy()


class NoStart(Algorithm):
    name = "nostart_journey"
    reads = frozenset()

    def policy(self):
        return NoStartPolicy()
'''


def jaxfl(*argv, cwd):
    done = subprocess.run([sys.executable, "-m", "jaxfl", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    return done.returncode, done.stdout, done.stderr


def test_a_sweep_file_and_a_config_file_naming_a_plugin_read_its_option_tables(tmp_path):
    """``[agenorm]`` and ``"agenorm.clip_factor"`` were refused ("unknown config field", "unknown option
    namespace") unless --algorithm on the command line imported the plug-in first."""
    (tmp_path / "sweep.toml").write_text(textwrap.dedent(f'''
        model = "mlp"
        clients = 4
        max_updates = 2
        timing_only = true
        [grid]
        algorithm = ["{EXAMPLE}:AgeNormFedBuff", "fedbuff"]
        "agenorm.clip_factor" = [1.0, 2.0]
        '''))
    status, out, err = jaxfl("sweep", "sweep.toml", "--out", "grid", "--no-progress", cwd=tmp_path)
    assert status == 0 and "3 cells: 3 run" in out, err[-2000:]
    (tmp_path / "run.toml").write_text(f'algorithm = "{EXAMPLE}:AgeNormFedBuff"\nmodel = "mlp"\nclients = 4\n'
                                       'max_updates = 2\ntiming_only = true\n[agenorm]\nclip_factor = 2.0\n')
    status, out, err = jaxfl("run", "--config", "run.toml", "--out", "runs", cwd=tmp_path)
    assert status == 0 and out.startswith("age_norm_fedbuff (timing only): 2 updates"), err[-2000:]
    (tmp_path / "missing.toml").write_text('algorithm = "not_here.py:Mine"\n[mine]\npower = 2.0\n')
    status, _, err = jaxfl("run", "--config", "missing.toml", cwd=tmp_path)
    assert status == 2 and "the unknown section [mine] (did you mean [engine]?) may be its options'" in err and \
        "algorithm reference 'not_here.py:Mine' could not be imported: no file 'not_here.py'" in err, err


def test_plugin_mistakes_are_named_where_they_are(tmp_path):
    (tmp_path / "helpers_beside.py").write_text("STEPS = 2\n")
    (tmp_path / "mine.py").write_text(PLUGIN)
    # a plug-in that does not import: why, not "unrecognized arguments: --agenorm.clip-factor 2"
    status, _, err = jaxfl("run", "--algorithm", "gone.py:Mine", "--gone.power", "2", *SMALL, cwd=tmp_path)
    assert status == 2 and err.strip() == ("jaxfl: error: algorithm reference 'gone.py:Mine' could not be imported: "
                                           f"no file 'gone.py' in the working directory {tmp_path} (so --gone.power "
                                           "is not known: its options come with it)")
    # its validate refusing with jaxfl's fail(): bad input, one line (it was a traceback and status 1)
    status, _, err = jaxfl("run", "--algorithm", f"{EXAMPLE}:AgeNormFedBuff", "--agenorm.clip-factor", "-1", *SMALL,
                           cwd=tmp_path)
    assert status == 2 and "Traceback" not in err, err
    assert err.startswith("jaxfl: error: agenorm.clip_factor=-1.0 is not allowed: a finite number > 0 (in your code: "
                          f"{EXAMPLE}, line "), err
    # an exception in its policy: the file and line, and the sweep's cell (a bare traceback before)
    status, _, err = jaxfl("sweep", "--algorithm", "mine.py:Raising,fedbuff", "--seed", "0", *SMALL, "--out", "swept",
                           cwd=tmp_path)
    last = err.strip().splitlines()[-1]
    assert status == 1 and "RuntimeError: boom in my policy" in err, err[-3000:]
    assert last.startswith(f"jaxfl: error in your code ({tmp_path / 'mine.py'}, line 18, in on_arrival; traceback "
                           "above): RuntimeError: boom in my policy; in sweep cell 0 (")
    # a policy without start(): refused before any work (it failed inside the simulation)
    status, _, err = jaxfl("run", "--algorithm", "mine.py:NoStart", *SMALL, "--out", "nostart", cwd=tmp_path)
    assert status == 2 and "which does not define start(self, sim)" in err and not (tmp_path / "nostart").exists(), err


def test_a_parallel_sweep_refuses_an_algorithm_registered_in_this_process_only(tmp_path):
    from jaxfl.algorithms import Algorithm, register, unregister
    from jaxfl.config import ConfigError
    from jaxfl.scheduler.simulation import Policy
    from jaxfl.sweep import run_sweep

    class Session(Algorithm):
        name = "session_only_journey"
        reads = frozenset()

        def policy(self):
            return Policy()

    register(Session)
    try:
        with pytest.raises(ConfigError, match=r"algorithm='session_only_journey' is not allowed with jobs=2: it is "
                                              r"registered in this process only .* or run with jobs=1"):
            run_sweep({"model": "mlp", "clients": 4, "max_updates": 2}, {"algorithm": ["session_only_journey"]},
                      str(tmp_path / "sweep"), progress=False, jobs=2)
        assert not (tmp_path / "sweep").exists()
    finally:
        unregister("session_only_journey")

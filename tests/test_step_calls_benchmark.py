"""benchmarks/step_calls.py at its quick size (a smoke test; its figures live in benchmarks/README.md):
it times the engine's own one-step and chunk programs over the same steps and reports both."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_step_calls_quick_times_one_step_calls_against_one_chunk(tmp_path):
    out = tmp_path / "calls.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "step_calls.py"), "--quick", "--json",
                           str(out)], check=True, capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text())
    assert {"machine", "device", "jax", "date", "command"} <= set(result)  # _report.run_header's
    assert result["data_dir"] == "/usr/share/datasets/fashion-mnist"  # jaxfl's folder, the default
    assert result["step_loop"] == "unrolled"  # the example CNN keeps XLA convolutions on a CPU
    assert [row["steps_per_call"] for row in result["rows"]] == [1, 2]
    assert all(row["cpu_ms_per_step"] > 0 and row["wall_ms_per_step"] > 0 for row in result["rows"])
    assert result["cpu_ratio_one_step_to_chunk"] > 0 and "one-step calls ÷ one chunk" in done.stdout


def test_step_calls_refuses_a_chunk_of_one_step():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "step_calls.py"), "--local-steps", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--local-steps 1 is not allowed: at least 2" in done.stderr

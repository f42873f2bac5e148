"""The benchmarks run at their quick size (a smoke test: they must not rot; figures live in
benchmarks/README.md, never in tests)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_scheduler_throughput_quick(tmp_path):
    out = tmp_path / "sched.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scheduler_throughput.py"), "--quick",
                    "--algorithms", "fedasync", "fedbuff", "fedcompass", "--json", str(out)], check=True,
                   capture_output=True, text=True, timeout=600)
    results = json.loads(out.read_text())["results"]
    assert {(r["algorithm"], r["clients"]) for r in results} == {(a, c) for a in ("fedasync", "fedbuff", "fedcompass")
                                                                 for c in (1000, 10000)}
    assert all(r["updates"] == 2000 and r["events"] > 0 for r in results)
    assert all(r["in_flight"] <= 1000 for r in results if r["algorithm"] != "fedcompass")


def test_cpu_speed_quick_runs_jaxfl_with_defaults_and_no_padding(tmp_path):
    # The PyTorch side runs where benchmarks/.venv-torch exists and is reported as skipped elsewhere.
    out = tmp_path / "cpu.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_speed.py"), "--quick",
                    "--workloads", "cross_device", "--json", str(out)], check=True, capture_output=True, text=True,
                   timeout=600)
    (row,) = json.loads(out.read_text())["rows"]
    (run,) = row["jaxfl_runs"]
    assert row["workload"] == "cross_device" and row["jaxfl_samples_per_second"] > 0
    assert run["plan"]["steps_per_call"] == 6  # one call per client's 6 local steps
    assert run["compilations"]["run_steps"] == 1
    if 4 % run["plan"]["devices"] == 0:  # 4 clients per round fill every call
        assert run["padding_waste"] == 0.0
    assert row["torch_samples_per_second"] is not None or "skipped" in row["torch_runs"][0]

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

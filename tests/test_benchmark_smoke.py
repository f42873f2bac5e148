"""The benchmarks run at their quick size (a smoke test: they must not rot; figures live in
benchmarks/README.md, never in tests)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = {"machine", "device", "jax", "date", "command"}  # _report.run_header's, in every benchmark's JSON


def test_scheduler_throughput_quick(tmp_path):
    out = tmp_path / "sched.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scheduler_throughput.py"), "--quick",
                           "--algorithms", "fedasync", "fedbuff", "fedcompass", "--json", str(out)], check=True,
                          capture_output=True, text=True, timeout=600)
    assert "is ignored" not in done.stderr  # each algorithm gets only the options it reads
    results = json.loads(out.read_text())["results"]
    assert all(0 <= r["start_s"] <= r["run_s"] and r["events_per_cpu_s"] > 0 for r in results)
    assert {(r["algorithm"], r["clients"]) for r in results} == {(a, c) for a in ("fedasync", "fedbuff", "fedcompass")
                                                                 for c in (1000, 10000)}
    assert all(r["updates"] == 2000 and r["events"] > 0 for r in results)
    assert all(r["in_flight"] <= 1000 for r in results if r["algorithm"] != "fedcompass")


def test_scheduler_throughput_writes_and_reads_an_event_log_of_n_rows():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scheduler_throughput.py"), "--log-rows",
                           "3001", "--log-formats", "run", "auto", "csv", "parquet"], check=True,
                          capture_output=True, text=True, timeout=600)
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    # (format, written as, rows): told 3,001 rows, "run" stays CSV below the 200,000-row switch
    assert [row[:3] for row in rows] == [["run", "csv", "3001"], ["auto", "csv", "3001"], ["csv", "csv", "3001"],
                                         ["parquet", "parquet", "3001"]]
    assert all(float(row[5]) > 0 for row in rows)  # CPU µs per row written


def test_scheduler_throughput_breakdown_names_the_parts_of_an_event():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "scheduler_throughput.py"), "--breakdown",
                           "--clients", "1000", "--updates", "300", "--concurrency", "100"], check=True,
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    micros = {line.rsplit(None, 2)[0]: float(line.split()[-2]) for line in lines if line.endswith("µs")}
    counts = {line.rsplit(None, 1)[0]: float(line.split()[-1]) for line in lines if not line.endswith("µs")}
    per_algorithm = {f"{algorithm} event, {log}" for algorithm in ("fedasync", "fedbuff", "fedcompass")
                     for log in ("with the event log", "without a log")}
    assert set(micros) == per_algorithm | {
        "log row (tuple + csv.writer)", "speed draw (ClientSpeeds.round_duration)", "queue push + pop (100 pending)",
        "reply push + pop (due now, 100 pending)",
        "idle-pool exchange", "dispatch record", "aggregation of one update (Simulation.aggregate, no log row)",
        "FedCompass JOINGROUP, 10 groups open", "FedCompass CREATEGROUP + timer, 10 groups open",
        "FedCompass JOINGROUP, 998 groups open", "FedCompass CREATEGROUP + timer, 998 groups open",
        "FedCompass JOINGROUP by the paper's scan, 10 groups open",
        "FedCompass JOINGROUP by the paper's scan, 998 groups open",
        "fedcompass event with the log, best of 2", "fedcompass event replayed: its simulation calls alone",
        "fedcompass event: FedCompass's own work (the difference)",
        "first-wave speed draw, one at a time (a fresh stream each)",
        "first-wave speed draws in bulk (ClientSpeeds.round_durations), per client"}
    assert all(value > 0 for name, value in micros.items() if "difference" not in name)  # a difference of noisy times
    assert set(counts) == {f"{algorithm}   {count} per event (count)" for algorithm in ("fedasync", "fedbuff", "fedcompass")
                           for count in ("rows", "dispatches", "aggregations")}
    # one aggregation per arrival, an arrival and a reply per update
    assert counts["fedasync   aggregations per event (count)"] == pytest.approx(0.5, abs=0.002)
    assert counts["fedcompass   dispatches per event (count)"] > 1  # the warm-up dispatches every client


def test_cpu_speed_quick_runs_jaxfl_with_defaults_and_no_padding(tmp_path):
    # The PyTorch side runs where benchmarks/.venv-torch exists and is reported as skipped elsewhere.
    out = tmp_path / "cpu.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_speed.py"), "--quick",
                    "--workloads", "cross_device", "--json", str(out)], check=True, capture_output=True, text=True,
                   timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and report["data_dir"] == "/usr/share/datasets/fashion-mnist"  # jaxfl's folder
    (row,) = report["rows"]
    (run,) = row["jaxfl_runs"]
    assert row["workload"] == "cross_device" and row["jaxfl_samples_per_second"] > 0
    assert run["samples_per_cpu_second"] > 0
    # CPU-ms per client step is the same CPU time per (batch of 10) samples
    assert run["cpu_ms_per_step"] == pytest.approx(10e3 / run["samples_per_cpu_second"], rel=0.001)
    assert run["plan"]["steps_per_call"] == 6  # the CNN's 6 steps, shared by every client: one 6-step call
    # every call that one chunk and its finish in one program, compiled once
    assert run["compilations"]["run_and_finish"] == 1 and "run_steps" not in run["compilations"]
    if 4 % run["plan"]["devices"] == 0:  # 4 clients per round fill every call
        assert run["padding_waste"] == 0.0
    assert row["torch_samples_per_second"] is not None or "skipped" in row["torch_runs"][0]


def test_cpu_step_quick_times_a_formulation(tmp_path):
    # --quick: one round of one call; of the formulation that swaps cpu_friendly's patches back to the former form
    out = tmp_path / "step.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_step.py"), "--quick", "--variants",
                           "minor_concat", "--json", str(out)], check=True, capture_output=True, text=True,
                          timeout=600)
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows == ["formulation", "minor_concat"]
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and (report["repeats"], report["calls"]) == (1, 1)
    (row,) = report["rows"]
    assert row["formulation"] == "minor_concat" and row["cpu_ms_per_step"] > 0 and row["wall_ms_per_step"] > 0


def test_cpu_step_profiles_formulations_side_by_side():
    # the pool's gradient as JAX's rule for a reshaped max needs a division (its tie count) that
    # cpu_friendly's rule, XLA's first-maximum choice, does not: one column has it, the other not
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_step.py"), "--profile", "default",
                           "reshape_pool", "--repeats", "1", "--calls", "1"], check=True, capture_output=True,
                          text=True, timeout=600)
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in done.stdout.splitlines()
            if line.startswith("| ")]
    assert rows[0][:2] == ["default ms/step", "reshape_pool ms/step"]
    # of the pool's shape (batch 10, 12 x 12 x 64): the profile may also show other divisions, and
    # XLA may split one into several fusions
    divisions = [row for row in rows if row[3].startswith("fusion") and row[3].split()[2:3] == ["div"]
                 and "10,12,12,64]" in row[3]]
    assert divisions and all(row[0] == "" for row in divisions) and max(float(row[1] or 0) for row in divisions) > 0


def test_client_batching_quick_has_the_one_big_model_limit_and_flops(tmp_path):
    out = tmp_path / "batching.json"
    # --quick at K = 2 alone (K = 1's row compiles three more programs: 70 s of the suite against 45) and
    # one step of 16 images a call (57 CPU s at its own 2 steps of 64, 34 at this): what is checked, the
    # rows, the limit and the FLOP counts, does not depend on the step count, the batch or K
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "client_batching.py"), "--quick",
                    "--clients", "2", "--steps", "1", "--steps-per-call", "1", "--batch-size", "16", "--im2col",
                    "--rolled", "--peak-tflops", "1.0", "--json", str(out)], check=True, capture_output=True, text=True,
                   timeout=600)
    report = json.loads(out.read_text())
    assert report["model"] == "cnn" and report["parameters"] == 582026
    assert {"machine", "device", "jax", "date", "command"} <= set(report)
    assert report["peak_tflops"] == 1.0 and report["client_step_flops"] > 0
    assert report["flops_source"] == "lowered for cpu"  # the program's count on every backend (see below)
    rows = report["rows"]
    assert [row["clients"] for row in rows] == [2]
    for row in rows:
        assert row["vmapped_client_steps_per_s"] > 0 and row["one_by_one_client_steps_per_s"] > 0
        assert row["limit_client_steps_per_s"] > 0 and row["vmapped_over_limit"] > 0
        assert len(row["seconds"]["vmapped"]) == len(row["seconds"]["limit"]) == 1
        # one step of the big model at batch K·B does K clients' work, give or take the optimiser
        assert abs(row["limit_step_flops"] / (row["clients"] * report["client_step_flops"]) - 1) < 0.05
        assert row["vmapped_mfu"] == row["vmapped_tflops"] > 0  # against a 1 TFLOP/s peak
        assert row["vmapped_calls_split_by_memory_guard"] == 0
        # --im2col: the same clients with their convolutions as batched matrix products, side by side
        assert row["im2col_client_steps_per_s"] > 0 and len(row["seconds"]["im2col"]) == 1
        assert row["im2col_over_vmapped"] == row["im2col_client_steps_per_s"] / row["vmapped_client_steps_per_s"]
        assert row["im2col_over_limit"] > 0 and row["im2col_calls_split_by_memory_guard"] == 0
        # --rolled: the same vmapped clients with their steps in one rolled loop (the CNN's XLA
        # convolutions run unrolled by default on a CPU), each engine's compile seconds beside
        assert row["vmapped_step_loop"] == "unrolled" and len(row["seconds"]["rolled"]) == 1
        assert row["rolled_over_vmapped"] == row["rolled_client_steps_per_s"] / row["vmapped_client_steps_per_s"]
        assert row["compile_seconds"]["vmapped"] > 0 and row["compile_seconds"]["rolled"] > 0


def test_client_batching_s_clock_stops_after_the_training_not_after_queuing_it(monkeypatch):
    # flush only queues the calls (the engine fetches their metrics when an aggregation reads them): a clock
    # stopped at its return timed the queuing, 1.5 ms against a second of training, and every rate was wrong
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import client_batching

    setup = client_batching.Setup("cnn", 2, 8, "sgd", 0.01)
    engine = setup.engine(clients_per_call=2, steps_per_call=1)
    fetched = engine.stats.metric_fetches
    assert client_batching.time_flush(engine, 2, 1, 0) > 0
    assert engine.stats.metric_fetches == fetched + 1 and not engine._unfetched  # its one call waited for


def test_client_batching_counts_the_flops_of_the_program_not_of_a_backends_compilation(monkeypatch):
    # XLA:GPU's compiled count leaves out the convolutions and products it hands to cuDNN and cuBLAS (an
    # H200's 0.234 GFLOP for the CNN's client-step at batch 64, 1.60 in the program): the first lease's
    # TFLOP/s and MFU were 6.8x too low for the CNN, 175x for ResNet-18. The count is taken from the step
    # lowered for the CPU, placed there whatever the inputs' device; here its convolution is counted whole
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import client_batching
    import jax
    import jax.numpy as jnp

    def convolution(images, kernel):  # NHWC images, HWIO kernel, no padding: 2·24·24·kh·kw·Ci·Co an image
        return jax.lax.conv_general_dilated(images, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    images, kernel = jnp.ones((4, 28, 28, 3)), jnp.ones((5, 5, 3, 32))
    flops, source = client_batching.step_flops(convolution, images, kernel)
    assert source == "lowered for cpu" and flops == 4 * 2 * 24 * 24 * 5 * 5 * 3 * 32
    # abstract inputs too (an eval_shape'd optimiser state), with PRNG keys among them
    state = jax.eval_shape(lambda: {"key": jax.random.key(0), "images": images})
    assert client_batching.step_flops(lambda s, k: convolution(s["images"], k), state, kernel)[0] == flops


@pytest.mark.slow
def test_client_batching_quick_resnet18_with_batchnorm_state(tmp_path):
    out = tmp_path / "resnet.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "client_batching.py"), "--quick",
                    "--model", "resnet18", "--clients", "1", "--steps", "1", "--steps-per-call", "1",
                    "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["model"] == "resnet18" and report["parameters"] == 11173962
    (row,) = report["rows"]
    assert row["clients"] == 1 and row["steps"] == 1 and row["batch_size"] == 8
    assert row["vmapped_client_steps_per_s"] > 0 and row["limit_client_steps_per_s"] > 0
    assert row["vmapped_tflops"] > 0 and row["limit_tflops"] > 0


def test_end_to_end_quick_runs_both_sides_of_both_workloads(tmp_path):
    out = tmp_path / "e2e.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "end_to_end.py"), "--quick", "--sides",
                           "defaults", "one_per_call", "rolled", "--json", str(out)],
                          check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert "| workload | rolled: wall s |" in done.stdout
    assert {"machine", "device", "jax", "date", "command"} <= set(report)
    assert [row["workload"] for row in report["rows"]] == ["fedbuff", "fedcompass"]
    for row in report["rows"]:
        assert row["repeats"] == 1 and row["ratio"] > 0 and row["dataset"] == "mnist10k"
        assert abs(row["defaults_accuracy"] - row["one_per_call_accuracy"]) <= 0.01  # the same run, batched or not
        assert abs(row["defaults_accuracy"] - row["rolled_accuracy"]) <= 0.01  # and with a rolled step loop
        assert row["rolled_training_ratio"] > 0 and row["rolled_compile_s"] > 0
    for name, updates in (("fedbuff", 3), ("fedcompass", 2)):
        defaults, = report["runs"][name]["defaults"]
        single, = report["runs"][name]["one_per_call"]
        assert single["plan"]["clients_per_call"] == 1 and single["plan"]["devices"] == 1
        assert single["mean_clients_per_batch"] == 1.0
        rolled, = report["runs"][name]["rolled"]
        for run in (defaults, single, rolled):
            # every program jax compiled, the step programs' among them
            assert run["jax_compile_s"] >= run["jax_backend_compile_s"] > 0
            assert run["jax_compile_s"] >= run["compile_wall_s"] * 0.9
            assert run["global_updates"] == updates and run["stop_reason"] == "update budget"
            assert run["samples"] == run["client_steps_executed"] * report["workloads"][name]["batch_size"]
            assert run["client_steps_executed"] >= run["client_steps_aggregated"] > 0
            # the host share's range: with jax's tracing seconds, and less their wall seconds (None where that
            # leaves less than nothing, not a clamped 0)
            assert run["host_share_with_tracing"] > 0
            assert run["host_share"] is None or 0 <= run["host_share"] <= run["host_share_with_tracing"]
        # one client a call runs every step in sequence; the defaults' calls run their longest
        assert single["steps_in_sequence"] == single["client_steps_executed"]
        assert 0 < defaults["steps_in_sequence"] <= defaults["client_steps_executed"]
        row, = [row for row in report["rows"] if row["workload"] == name]
        assert row["step_bound"] == single["steps_in_sequence"] / defaults["steps_in_sequence"]


def test_end_to_end_step_bounds_count_an_accelerators_calls_without_one(tmp_path):
    """--step-bounds: the step bound of each workload for one accelerator's defaults, counted on the
    CPU with a logistic regression (the schedule and the batching do not depend on the model)."""
    out = tmp_path / "bounds.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "end_to_end.py"), "--step-bounds",
                           "--quick", "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert report["clients_per_call"] == 256
    assert [row["workload"] for row in report["rows"]] == ["fedbuff", "fedcompass"]
    for row in report["rows"]:
        fast, slow = row["steps_in_sequence"]
        assert 0 < fast <= slow and row["step_bound"] == slow / fast
        assert row["calls"][0] <= row["calls"][1] and row["mean_clients_per_batch"] >= 1
    assert "| fedbuff |" in done.stdout and "step bound" in done.stdout


def test_client_state_quick_places_the_bank_three_ways_with_one_result(tmp_path):
    out = tmp_path / "client_state.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "client_state.py"), "--quick",
                    "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    rows = {row["placement"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"device", "host", "memmap"}
    assert all(row["bit_identical_to_device"] and row["client_state_bytes"] == 40 * row["model_bytes"]
               for row in rows.values())
    assert rows["device"]["hook_state_bytes"] == 40 * rows["device"]["model_bytes"]
    assert rows["host"]["hook_state_bytes"] == rows["memmap"]["hook_state_bytes"] == 0


def test_million_clients_quick_trains_fedbuff_with_what_is_in_flight(tmp_path):
    out = tmp_path / "million.json"
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "million_clients.py"), "--quick",
                    "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert {"machine", "device", "jax", "date", "command", "load_average_before"} <= set(report)
    (row,) = report["rows"]
    assert row["model"] == "logreg" and row["clients"] == 2000 and row["concurrency"] == 100
    assert row["aggregations"] == 3 and row["stop_reason"] == "update budget"
    assert row["client_steps_executed"] == row["client_steps_aggregated"] == 3 * 10 * 5  # K = 10, 5 steps
    assert row["executed_per_aggregated"] == 1.0
    assert row["final_loss"] < row["start_loss"] and row["evaluations"] == 4  # versions 0 to 3
    assert row["build_s"] > 0 and 0 < row["first_update_s"] <= row["run_s"] and row["peak_host_mb"] > 0


def test_the_gpu_buttons_fit_a_lease_of_15_device_minutes():
    """A lease is 15 minutes of device time, the machine's start (a minute or two) and idle time
    counted: gpu_suite.sh is one call whose preflight and steps run under limits adding up to at most
    540 s of the tool's 600 s, and gpu_extra.sh a short second call on the warm machine, at most
    255 s, so that start, both calls and the transfers fit in 900 s (the first lease's start and
    transfers took 94 s of it). Each brings back at most 8 files (the tool's limit): one log,
    device.txt and a JSON per step."""
    import re

    budgets = {"gpu_suite.sh": 540, "gpu_extra.sh": 255}
    for script, budget in budgets.items():
        with open(os.path.join(ROOT, "benchmarks", script)) as handle:
            text = handle.read()
        calls = re.findall(r"^(step \w+|preflight) (\d+)", text, re.MULTILINE)
        assert len(calls) >= 3 and sum(int(limit) for _, limit in calls) <= budget, (script, calls)
        assert 2 + len(re.findall(r"--json", text)) <= 8, script
        if script == "gpu_suite.sh":
            assert calls[0][0] == "preflight", calls  # first, before any step


def test_the_gpu_preflight_stops_the_button_when_jax_runs_on_the_cpu(tmp_path):
    """Without QUICK the button is for a GPU: on the CPU its preflight stops it at once, with exit
    status 1 and the reason in its log, before any benchmark runs."""
    env = {**os.environ, "OUT": str(tmp_path), "JAX_PLATFORMS": "cpu",  # python3: this interpreter
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    env.pop("QUICK", None)
    result = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_suite.sh")], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    log = (tmp_path / "log.txt").read_text()
    assert "runs on the CPU" in log and "preflight failed" in log and "client_batching" not in log
    assert sorted(os.listdir(tmp_path)) == ["device.txt", "log.txt"]


@pytest.mark.parametrize("preflight_exits, button_goes_on", [("sleep 30", True), ("exit 3", False)])
def test_a_preflight_cut_at_its_limit_goes_on_and_a_failing_one_stops_the_button(tmp_path, preflight_exits,
                                                                                 button_goes_on):
    """A preflight that runs past its limit met no failure (a slow compilation): the button goes on to
    its steps. One that fails stops it with exit status 1. ``python3`` here is a stand-in whose
    preflight (the script read from stdin) sleeps or fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nif [ "$1" = "-" ]; then cat >/dev/null; {preflight_exits}; fi\n')
    (bin_dir / "python3").chmod(0o755)
    script = f'source {os.path.join(ROOT, "benchmarks", "gpu_common.sh")}; preflight 1; echo "after preflight"'
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    log = (tmp_path / "out" / "log.txt").read_text()
    if button_goes_on:
        assert result.returncode == 0 and "after preflight" in result.stdout, result.stdout + result.stderr
        assert "preflight cut at its 1 s limit" in log
    else:
        assert result.returncode == 1 and "after preflight" not in result.stdout
        assert "preflight failed (exit status 3)" in log


def test_sweep_lockstep_quick_times_one_flush_of_2k_against_two_of_k(tmp_path):
    out = tmp_path / "lockstep.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sweep_lockstep.py"), "--quick",
                           "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report)
    (row,) = report["rows"]
    assert "| model | K | steps | batch | two flushes of K s | one flush of 2K s | lockstep speed-up |" in done.stdout
    assert "| mlp | 2 | 2 | 16 |" in done.stdout
    assert (row["model"], row["K"], row["steps"]) == ("mlp", 2, 2)
    assert row["two_flushes_of_K_s"] > 0 and row["one_flush_of_2K_s"] > 0
    assert row["lockstep_speedup"] == pytest.approx(row["two_flushes_of_K_s"] / row["one_flush_of_2K_s"], rel=0.01)


def test_sweep_jobs_quick_runs_the_grid_at_each_jobs_to_the_same_results(tmp_path):
    out = tmp_path / "jobs.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "sweep_jobs.py"), "--quick",
                           "--keep", str(tmp_path / "sweeps"), "--json", str(out)],
                          check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and (report["cells"], report["updates"]) == (2, 5)
    assert [row["jobs"] for row in report["rows"]] == [1, 2]
    assert "| jobs | wall s | cells/min | speed-up | max final-accuracy difference |" in done.stdout
    for row in report["rows"]:
        reference = report["rows"][0]["wall_s"]
        assert row["wall_s"] > 0 and row["speedup"] == pytest.approx(reference / row["wall_s"], rel=0.02)
        assert row["max_accuracy_difference"] <= 0.01  # float32 reassociation between device counts, no more
    # each side a sweep of its own, with a compilation cache of its own that it filled
    for side in ("jobs1-0", "jobs2-1"):
        assert len(os.listdir(tmp_path / "sweeps" / side / "runs")) == 2
        assert os.listdir(tmp_path / "sweeps" / f"{side}-xla-cache")


def test_determinism_quick_finds_two_fresh_processes_train_the_same_model_bit_for_bit(tmp_path):
    # jaxfl's promise on a CPU, across processes (no compilation cache: each compiles afresh)
    out = tmp_path / "determinism.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "determinism.py"), "--quick", "--flags", "",
                           "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and report["config"]["model"] == "logreg"
    (row,) = report["rows"]
    assert (row["flags"], row["runs"], row["bit_identical"], row["largest_parameter_difference"]) == ("", 2, True, 0.0)
    assert len(set(row["final_accuracies"])) == 1 and row["median_compile_s"] > 0
    assert "| (none) | yes | 0 |" in done.stdout


def test_checkpoint_overhead_quick_runs_the_three_cadences_to_the_same_model(tmp_path):
    out = tmp_path / "checkpoints.json"  # --quick: one round of 25 updates of logreg
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "checkpoint_overhead.py"), "--quick",
                    "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and (report["model"], report["updates"], report["repeats"]) == ("logreg", 25, 1)
    saves = {row["side"]: row["saves"] for row in report["table"]}
    assert saves == {"none": 1, "every 25": 2, "default": 1}  # the end; 25 and the end; 60 s not yet passed
    assert len({accuracy for row in report["table"] for accuracy in row["final_accuracy"]}) == 1


def test_narrow_convolutions_quick_times_lenet5_both_ways_and_an_evaluation(tmp_path):
    # LeNet-5: unrolled before (its first layer left to XLA), one rolled loop now; the evaluation's four forms.
    # --quick: lenet5 alone, batch 2, 2 clients, 2 steps, one round
    script, out = os.path.join(ROOT, "benchmarks", "narrow_convolutions.py"), tmp_path / "narrow.json"
    done = subprocess.run([sys.executable, script, "--quick", "--json", str(out)], capture_output=True, text=True,
                          timeout=600, check=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("| lenet5 |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[:3] == ["lenet5", "2", "unrolled"] and cells[4] == "rolled" and float(cells[3]) > 0 < float(cells[5])
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and (report["clients"], report["steps"], report["repeats"]) == (2, 2, 1)
    (row,) = report["rows"]
    assert (row["model"], row["batch"], row["before_loop"], row["now_loop"]) == ("lenet5", 2, "unrolled", "rolled")
    done = subprocess.run([sys.executable, script, "--evaluation", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, check=True)
    row = next(line for line in done.stdout.splitlines() if line.startswith("| lenet5 |"))
    cells = row.strip("|").split("|")[1:]
    assert len([float(cell) for cell in cells[:4]]) == 4 and cells[4].strip() == "106"  # the cache-sized batch
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "lenet5" and row["cache_batch"] == 106 and row["narrow_only_cache_batch_s"] > 0
    assert row["images"] == 2000  # --quick's held-out set (10,000 by default)


def test_minibatch_sampling_quick_draws_both_ways(tmp_path):
    out = tmp_path / "sampling.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "minibatch_sampling.py"), "--quick",
                           "--json", str(out)], check=True, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert HEADER <= set(report) and (report["clients"], report["batch_size"], report["repeats"]) == (2, 8, 3)
    (row,) = report["rows"]
    assert row["max_count"] == 600 and row["calls_timed"] == 3
    assert row["argsort_ms_per_call"] > 0 and row["feistel_ms_per_call"] > 0
    assert any(line.split()[:1] == ["600"] for line in done.stdout.splitlines())  # the table's row


def test_torch_loop_quick_parses_its_arguments_and_skips_without_torch(tmp_path):
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is importable: test_cpu_speed_quick_... runs torch_loop.py's quick size through cpu_speed.py")
    out = tmp_path / "torch.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "torch_loop.py"), "--quick",
                           "--workload", "cross_silo", "--rounds", "1", "--threads", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "torch_loop: SKIPPED: torch is not installed" in done.stdout, done.stderr
    record = json.loads(out.read_text())
    assert record["workload"] == "cross_silo" and "torch is not installed" in record["skipped"]


MISSING_FOLDER = "/nonexistent/fashion-mnist"


@pytest.mark.parametrize("script, arguments, named", [
    ("end_to_end.py", ["--fedbuff-updates", "-1"], "--fedbuff-updates -1 is not allowed: at least 1"),
    ("end_to_end.py", ["--repeats", "0"], "--repeats 0 is not allowed"),
    ("client_batching.py", ["--clients", "4", "0"], "--clients 4 0 is not allowed: each value at least 1"),
    ("client_batching.py", ["--steps-per-call", "0"], "--steps-per-call 0 is not allowed"),
    ("sweep_lockstep.py", ["--repeats", "0"], "--repeats 0 is not allowed"),
    ("determinism.py", ["--runs", "1"], "--runs 1 is not allowed: at least 2"),
    ("determinism.py", ["--per-round", "20"], "--per-round 20 is not allowed: at most --clients (16)"),
    ("determinism.py", ["--model", "bogus"], "--model: model='bogus' is not allowed"),
    ("sweep_jobs.py", ["--jobs", "1", "0"], "--jobs 1 0 is not allowed: each value at least 1"),
    ("sweep_jobs.py", ["--jobs", "1", "100000"], "--jobs 1 100000 is not allowed: each value at most"),
    ("cpu_speed.py", ["--repeats", "0"], "--repeats 0 is not allowed"),
    ("cpu_speed.py", ["--data-dir", MISSING_FOLDER], f"--data-dir {MISSING_FOLDER} is not allowed: no such folder"),
    ("step_calls.py", ["--data-dir", MISSING_FOLDER], f"--data-dir {MISSING_FOLDER} is not allowed: no such folder"),
    ("client_state.py", ["--repeats", "0"], "--repeats 0 is not allowed"),
    # a size jaxfl's config refuses: its ConfigError, led by the flag
    ("client_state.py", ["--clients", "10", "--per-round", "20"], "--per-round: clients_per_round=20 is not allowed"),
    ("million_clients.py", ["--clients", "10", "--concurrency", "100"], "--concurrency: concurrency=100"),
    ("minibatch_sampling.py", ["--max-counts", "0"], "--max-counts 0 is not allowed"),
    ("checkpoint_overhead.py", ["--quick", "--updates", "10"], "--updates 10 is not allowed: at least 25"),
    ("cpu_step.py", ["--calls", "0"], "--calls 0 is not allowed"),
    ("narrow_convolutions.py", ["--quick", "--steps", "0"], "--steps 0 is not allowed"),
    ("narrow_convolutions.py", ["--evaluation", "--images", "0"], "--images 0 is not allowed: at least 1"),
    ("torch_loop.py", ["--threads", "0"], "--threads 0 is not allowed: at least 1"),
])
def test_a_bad_value_is_refused_naming_its_flag_before_any_work(script, arguments, named, monkeypatch, capsys):
    # parser.error: exit status 2 and the flag, its value and what is allowed, before anything compiles.
    # The script runs in this process, as `python3 script ...` runs it (a process of its own cost about
    # 3 s of imports); what it changes at import, sys.path and the environment, is put back after.
    import runpy

    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))  # the script's folder first; sys.path put back whole
    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "benchmarks", script), *arguments])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(sys.argv[0], run_name="__main__")
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and named in err, err[-2000:]
    assert out == ""

"""What a step call costs beyond its steps (issue 17): the engine's own compiled step programs for the
cross-device benchmark's call (``cpu_speed.py``: the example CNN, batch 10, one client per device),
``local_steps`` one-step calls against one ``local_steps``-step call, alternating in one process so
that a shared machine's noise hits both. It prints wall and CPU milliseconds per step (medians over
the rounds after the first two) and their ratio: the per-call overhead a chunk saves.

    python benchmarks/step_calls.py                  # 6 steps, 12 rounds of 4 client rounds each
    python benchmarks/step_calls.py --quick          # seconds-long smoke size (CI)
    python benchmarks/step_calls.py --json out.json
    python benchmarks/step_calls.py --data-dir /path/to/fashion-mnist   # the IDX files (.gz) elsewhere

CPU time is the process's (``time.process_time()``: every thread's, XLA's included, at the clock's
resolution, not ``os.times()``'s 10 ms ticks). The JSON has ``_report.run_header``'s machine, device,
jax version and date.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_speed  # noqa: E402  (the cross-device workload's config)

from jaxfl import run_experiment  # noqa: E402
from jaxfl.data.datasets import FASHION_MNIST_DIR  # noqa: E402
from jaxfl.kernels.client import ClientView  # noqa: E402
from _report import check_data_dir, run_header, write_json  # noqa: E402  (benchmarks/_report.py)


def measure(local_steps: int, rounds: int, client_rounds: int, data_dir: str | None = None,
            quick: bool = False) -> dict:
    """Per-step wall and CPU milliseconds of ``local_steps`` one-step calls and of one chunk call."""
    # (the run builds the engine alone: the programs timed hold one client a device, whatever the round's size)
    size = dict((cpu_speed.QUICK if quick else cpu_speed.WORKLOADS)["cross_device"], local_steps=local_steps, rounds=1)
    with tempfile.TemporaryDirectory() as folder:
        config = dataclasses.replace(cpu_speed.workload_config("cross_device", size, folder, "calls", data_dir),
                                     max_updates=1, eval_every=1, eval_at_start=False)
        engine = run_experiment(config).engine  # the engine as a run builds it: plan, mesh, programs
    padded = engine.mesh.size  # one client per device, as the CPU default trains them
    programs = {"one-step calls": (engine.compiled_steps(padded, 1)[0], [1] * local_steps),
                f"one {local_steps}-step call": (engine.compiled_steps(padded, local_steps)[0], [local_steps])}
    stacked = jax.tree.map(lambda leaf: jnp.stack([leaf] * padded), engine.params)
    states = jax.vmap(engine.trainer.init)(stacked, jnp.full(padded, 2**30, jnp.int32),
                                           jax.random.split(jax.random.key(0), padded),
                                           jnp.ones(padded, jnp.float32))
    states = jax.device_put(states, engine._all_devices.by_client)
    views = jax.device_put(ClientView(jnp.arange(padded, dtype=jnp.int32) * 60, jnp.full(padded, 60, jnp.int32)),
                           engine._all_devices.by_client)
    timings = {name: [] for name in programs}
    for _ in range(rounds):
        for name, (program, lengths) in programs.items():
            jax.block_until_ready(states)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(client_rounds):
                for length in lengths:
                    states = program(states, engine._all_devices.training_data, views, np.int32(length))
                jax.block_until_ready(states)
            steps = client_rounds * local_steps
            timings[name].append(((time.perf_counter() - wall) * 1e3 / steps,
                                  (time.process_time() - cpu) * 1e3 / steps))
    measured = {name: values[2:] if len(values) > 2 else values for name, values in timings.items()}
    rows = [{"calls": name, "steps_per_call": programs[name][1][0],
             "wall_ms_per_step": round(statistics.median(wall for wall, _ in values), 3),
             "cpu_ms_per_step": round(statistics.median(cpu for _, cpu in values), 3),
             "cpu_ms_range": [round(min(cpu for _, cpu in values), 3), round(max(cpu for _, cpu in values), 3)]}
            for name, values in measured.items()]
    return {"devices": int(engine.mesh.size), "step_loop": engine.step_loop, "rows": rows,
            "cpu_ratio_one_step_to_chunk": round(rows[0]["cpu_ms_per_step"] / rows[1]["cpu_ms_per_step"], 3),
            "wall_ratio_one_step_to_chunk": round(rows[0]["wall_ms_per_step"] / rows[1]["wall_ms_per_step"], 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local-steps", type=int, default=6, help="steps of a client round (the chunk's length)")
    parser.add_argument("--rounds", type=int, default=12, help="alternations of the two sides (the first two warm up)")
    parser.add_argument("--client-rounds", type=int, default=4, help="client rounds timed per alternation")
    parser.add_argument("--data-dir", default=FASHION_MNIST_DIR,
                        help="folder of the Fashion-MNIST IDX files (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke size")
    parser.add_argument("--json", help="write the figures, the machine, device, jax version and date here")
    args = parser.parse_args(argv)
    for name in ("local_steps", "rounds", "client_rounds"):
        if getattr(args, name) < (2 if name == "local_steps" else 1):
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} is not allowed: at least "
                         f"{2 if name == 'local_steps' else 1}")
    check_data_dir(parser, "--data-dir", args.data_dir)
    if args.quick:
        args.local_steps, args.rounds, args.client_rounds = 2, 3, 1
    result = measure(args.local_steps, args.rounds, args.client_rounds, args.data_dir, quick=args.quick)
    print(f"{result['devices']} devices, {result['step_loop']} steps, load average {os.getloadavg()[0]:.1f}")
    print(f"{'calls':<22} {'wall ms/step':>12} {'CPU ms/step':>12} {'CPU range':>16}")
    for row in result["rows"]:
        print(f"{row['calls']:<22} {row['wall_ms_per_step']:>12.2f} {row['cpu_ms_per_step']:>12.2f} "
              f"{row['cpu_ms_range'][0]:>7.2f}–{row['cpu_ms_range'][1]:<7.2f}")
    print(f"one-step calls ÷ one chunk: CPU {result['cpu_ratio_one_step_to_chunk']:.3f}, "
          f"wall {result['wall_ratio_one_step_to_chunk']:.3f}")
    write_json(args.json, {**run_header("step_calls", quick=args.quick, local_steps=args.local_steps,
                                        rounds=args.rounds, client_rounds=args.client_rounds, data_dir=args.data_dir,
                                        load_average=os.getloadavg()[0]), **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())

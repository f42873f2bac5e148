"""Per-client state off the device (issue 13): what each placement of CC-FedAvg's bank costs.

CC-FedAvg (Zhang et al., IEEE IoT Journal 2024) keeps every client's last update, a model per
client. ``--client-state`` places that bank on the device, in host RAM or in a memmap under the run
directory (``jaxfl.client_state``); an aggregation moves only its round's rows. This runs the same
CC-FedAvg run in each placement, alternating (medians of ``--repeats``), and prints for each:

- the engine's own device accounting: ``hook_state_bytes`` (the bank while it is on the device),
  ``peak_model_state_bytes`` and ``peak_client_rows_bytes`` (the rows one gather put there);
- its wall time per round (the run's wall time less compilation and evaluation, over its rounds;
  after one unmeasured warm-up run; the order of the sides rotates from repeat to repeat) and the
  ratio to the device placement, side by side in one process; and the part of it outside the
  training calls (aggregation, where the bank's rows move, and the scheduler);
- that the final parameters equal the device placement's bit for bit.

    python benchmarks/client_state.py                            # 2,000 clients, MLP, 20 per round
    python benchmarks/client_state.py --clients 500 --model cnn --rounds 10
    python benchmarks/client_state.py --quick                    # seconds-long smoke size (CI)
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile

import jax
import numpy as np

from jaxfl import RunConfig, run_experiment
from _report import check_at_least, run_header, validated, write_json  # benchmarks/_report.py

PLACEMENTS = ("device", "host", "memmap")


# the config fields the flags set, for naming the flag in a ConfigError
FLAGS = {"model": "--model", "clients": "--clients", "clients_per_round": "--per-round", "local_steps": "--steps",
         "max_updates": "--rounds", "eval_every": "--rounds"}


def config_for(placement: str, args, output_dir: str, repeat) -> RunConfig:
    return RunConfig(algorithm="ccfedavg", algorithm_options={"strategy": "cc"}, dataset="mnist10k",
                     model=args.model, clients=args.clients, clients_per_round=args.per_round,
                     local_steps=args.steps, batch_size=10, client_optimizer="sgd", client_lr=0.05,
                     max_updates=args.rounds, stop_at_target=False, eval_every=args.rounds,
                     eval_at_start=False, progress=False, checkpoint_every=None, final_checkpoint=False,
                     client_state=placement, output_dir=output_dir, run_name=f"{placement}-{repeat}")


def run(placement: str, args, output_dir: str, repeat: int):
    config = config_for(placement, args, output_dir, repeat)
    gc.collect()  # the previous run's bank is freed before this one allocates its own
    result = run_experiment(config)
    summary = result.summary
    seconds = summary["wall_time_s"] - summary["compile_wall_s"] - summary["evaluation_wall_s"]
    return result, seconds / args.rounds, (seconds - summary["training_wall_s"]) / args.rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    check_at_least(parser, args, {"clients": 1, "per_round": 1, "steps": 1, "rounds": 1, "repeats": 1})
    if args.quick:
        args.clients, args.per_round, args.rounds, args.repeats = 40, 4, 3, 1
    for placement in PLACEMENTS:  # a size jaxfl refuses (more per round than clients, ...) fails here, before any run
        validated(parser, config_for(placement, args, "unused", 0), FLAGS)
    seconds = {placement: [] for placement in PLACEMENTS}
    outside = {placement: [] for placement in PLACEMENTS}
    memory, params = {}, {}

    def table(echo: bool) -> list[dict]:
        """The rows of the placements measured so far (the device placement is the reference)."""
        if not seconds["device"]:
            return []
        load = os.getloadavg()
        model_bytes = memory["device"]["model_bytes"]
        if echo:
            print(f"CC-FedAvg, {args.clients} clients, {args.per_round} per round, {args.model} "
                  f"({model_bytes / 2**20:.2f} MiB), {args.steps} steps, {args.rounds} rounds, {args.repeats} repeats; "
                  f"bank {memory['device']['client_state_bytes'] / 2**20:.1f} MiB; {jax.devices()[0].device_kind}, "
                  f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
            print(f"{'placement':<10}{'hook MiB':>10}{'peak model-state MiB':>22}{'peak rows MiB':>15}"
                  f"{'s/round':>10}{'vs device':>11}{'outside training':>18}  params")
        base = statistics.median(seconds["device"])
        rows = []
        for placement in PLACEMENTS:
            if not seconds[placement]:
                continue
            m, median = memory[placement], statistics.median(seconds[placement])
            same = all(np.array_equal(a, b) for a, b in zip(params["device"], params[placement]))
            rows.append({"placement": placement, **m, "seconds_per_round": seconds[placement], "median": median,
                         "outside_training_per_round": outside[placement],
                         "ratio_to_device": median / base, "bit_identical_to_device": same})
            if echo:
                print(f"{placement:<10}{m['hook_state_bytes'] / 2**20:>10.1f}"
                      f"{m['peak_model_state_bytes'] / 2**20:>22.1f}{m['peak_client_rows_bytes'] / 2**20:>15.2f}"
                      f"{median:>10.3f}{median / base:>11.2f}{statistics.median(outside[placement]):>18.3f}  "
                      f"{'bit-identical' if same else 'DIFFER'}")
        return rows

    def save() -> None:  # after every run: a run cut short by a time limit keeps what it measured
        write_json(args.json, {**run_header("client_state", load_average=os.getloadavg(), args=vars(args)),
                               "rows": table(echo=False)}, indent=1)

    with tempfile.TemporaryDirectory() as output_dir:
        run("device", args, output_dir, "warm-up")  # compiles what every side then reuses, unmeasured
        for repeat in range(args.repeats):
            order = PLACEMENTS[repeat % 3:] + PLACEMENTS[:repeat % 3]  # alternating, rotated
            for placement in order:
                result, per_round, outside_training = run(placement, args, output_dir, repeat)
                seconds[placement].append(per_round)
                outside[placement].append(outside_training)
                memory[placement] = result.summary["device_memory"]
                params[placement] = [np.asarray(leaf) for leaf in jax.tree.leaves(result.params)]
                assert result.summary["device_memory"]["client_state_placement"] == placement
                del result
                save()
                print(f"  {placement} (repeat {repeat}): {per_round:.3f} s/round", flush=True)
    table(echo=True)


if __name__ == "__main__":
    main()

"""Client-steps per second: K clients trained in one vmapped call vs one client per call.

Both sides run the real engine (``jaxfl.engine.Engine``) on the FedCompass MNIST CNN (582,026
parameters, batch 64, Adam) over the embedded MNIST data split among K clients: K dispatches are
queued, then ``flush()`` trains them, either all in one call (``clients_per_call=K``) or one per
call (``clients_per_call=1``). Compilation is excluded (one warm-up flush per plan); the two
sides alternate within one run so machine noise hits both alike, and the script prints the ratio.

    python benchmarks/client_batching.py                 # K in 1 8 32 128, 10 local steps
    python benchmarks/client_batching.py --clients 1 8 --steps 5 --repeats 2
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from jaxfl.data import build_federation, load_dataset
from jaxfl.engine import Engine, ExecutionPlan
from jaxfl.experiment import make_client_optimizer
from jaxfl.kernels import FederatedArrays, make_client_trainer, make_server_optimizer
from jaxfl.models import make_model
from jaxfl.scheduler.simulation import DispatchRecord


def make_engine(num_clients: int, clients_per_call: int, steps_per_call: int):
    dataset = load_dataset("mnist10k")
    federation = build_federation(dataset, num_clients, "iid", seed=0)
    model = make_model("cnn", dataset.num_classes)
    params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    trainer = make_client_trainer(model.apply, make_client_optimizer("adam", 0.003), 64)
    return Engine(trainer, params, FederatedArrays(jnp.asarray(federation.x), jnp.asarray(federation.y)),
                  federation.offsets, federation.counts, make_server_optimizer(), seed=0,
                  plan=ExecutionPlan(clients_per_call, steps_per_call))


def time_flush(engine: Engine, num_clients: int, steps: int, round_index: int) -> float:
    """Seconds to train ``num_clients`` queued dispatches (flush blocks on the results' metrics)."""
    records = [DispatchRecord(id=round_index * num_clients + client, client=client, version=0, steps=steps,
                              client_round=round_index, start_time=0.0, arrival_time=1.0)
               for client in range(num_clients)]
    for record in records:
        engine.on_dispatch(record)
    start = time.perf_counter()
    engine.flush()
    elapsed = time.perf_counter() - start
    for record in records:  # discard the updates so memory does not grow across repeats
        engine.on_drop(record)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--steps", type=int, default=10, help="local steps per client")
    parser.add_argument("--steps-per-call", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the table, machine, device, jax version and date here")
    args = parser.parse_args()
    rows = []
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax {jax.__version__}, "
          f"MNIST CNN, batch 64, {args.steps} local steps, median of {args.repeats}")
    print(f"{'K':>5} {'vmapped steps/s':>16} {'one-by-one steps/s':>19} {'ratio':>7}")
    for num_clients in args.clients:
        batched = make_engine(num_clients, num_clients, args.steps_per_call)
        single = make_engine(num_clients, 1, args.steps_per_call)
        time_flush(batched, num_clients, args.steps, 0)  # compile
        time_flush(single, num_clients, args.steps, 0)
        batched_times, single_times = [], []
        for repeat in range(1, args.repeats + 1):
            batched_times.append(time_flush(batched, num_clients, args.steps, repeat))
            single_times.append(time_flush(single, num_clients, args.steps, repeat))
        work = num_clients * args.steps
        batched_rate = work / statistics.median(batched_times)
        single_rate = work / statistics.median(single_times)
        print(f"{num_clients:>5} {batched_rate:>16.1f} {single_rate:>19.1f} {batched_rate / single_rate:>7.2f}",
              flush=True)
        rows.append({"clients": num_clients, "vmapped_client_steps_per_s": batched_rate,
                     "one_by_one_client_steps_per_s": single_rate, "ratio": batched_rate / single_rate})
        if args.json:  # after every row: a run cut short by a time limit keeps what it measured
            with open(args.json, "w") as handle:
                json.dump({"benchmark": "client_batching", "date": datetime.datetime.now(datetime.timezone.utc)
                           .isoformat(timespec="seconds"), "machine": platform.node(),
                           "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
                           "jax": jax.__version__, "args": vars(args), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()

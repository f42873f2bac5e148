"""The PyTorch baseline: jaxfl's CPU speed workloads as a plain sequential PyTorch FedAvg loop.

This is the "how a researcher writes it" side of the side-by-side benchmark (issue 17): synchronous
FedAvg where, every round, each sampled client in turn loads the global ``state_dict`` into one
model, runs its local steps with ``torch.optim.SGD``, and adds its parameters to a running sum; the
server then sets the global model to the equal-weight average (server learning rate 1). There is no
multiprocessing, no vmap and no compilation: one process, one model, one client after another,
with torch's intra-op threads (``--threads``) as the only parallelism.

It does not import jax or jaxfl, only torch, numpy and the standard library, so it runs in its own
environment (torch is not a dependency of jaxfl)::

    python3 -m venv benchmarks/.venv-torch                       # git-ignored
    benchmarks/.venv-torch/bin/pip install torch==2.13.0 numpy   # the CPU wheel: no CUDA packages

    benchmarks/.venv-torch/bin/python benchmarks/torch_loop.py --workload cross_device --rounds 5 --json out.json
    benchmarks/.venv-torch/bin/python benchmarks/torch_loop.py --workload cross_silo --rounds 2
    benchmarks/.venv-torch/bin/python benchmarks/torch_loop.py --quick --workload cross_device   # seconds

Run with a Python that has no torch it prints a SKIPPED line, writes ``{"skipped": ...}`` to
``--json`` if given, and exits 0, so a suite can call it unconditionally.

Workloads (the same data, model and optimisation as jaxfl's CPU speed workloads):

* data: Fashion-MNIST's 60,000 training images (the IDX gzip files in
  ``/usr/share/datasets/fashion-mnist``, or ``--data-dir``), pixels scaled to [0, 1] float32, split
  IID: one permutation seeded by ``--seed``, cut into consecutive equal blocks, one per client.
* model: the CNN of PyTorch's MNIST example without its dropout layers (jaxfl's ``cnn_example``):
  Conv2d(1, 32, 3) ReLU, Conv2d(32, 64, 3) ReLU, MaxPool2d(2), Flatten, Linear(9216, 128) ReLU,
  Linear(128, 10), softmax cross-entropy; 1,199,882 parameters (asserted).
* ``cross_device``: 1,000 clients x 60 images; 50 clients sampled (without replacement) per round;
  each client runs one epoch, 6 SGD steps of batch 10 in its own shuffled order; lr 0.1, no momentum.
* ``cross_silo``: 10 clients x 6,000 images; all 10 every round; each 50 SGD steps of batch 64 taken
  from a per-client shuffled order (wrapping around if the steps outrun it); lr 0.1.

``--quick`` shrinks the run to a smoke test of a few seconds: 2 timed rounds (unless ``--rounds``
is given), 4 clients per round for cross_device, 2 local steps for cross_silo, and the accuracy
measured on the first 1,000 test images instead of all 10,000.

Timing: loading, partitioning and building the model are not timed, nor are the ``--warmup-rounds``
(default 1, which do train). Each timed round is measured with ``time.perf_counter`` from the
start of the round (client sampling included) to the averaged model being loaded back. The figures
are the median seconds per round and, from it, client-steps per second and samples per second
(client-steps x batch size / s); the record also keeps every round's seconds and the load average
before and after the timed rounds. After the timed rounds the final model's accuracy on the 10,000
test images (``t10k`` files) is printed, untimed, to show that learning happened.

As the baseline: run this script and the jaxfl side of the same workload on the same machine, at
the same thread count, close together in time (the development machines are shared and noisy), and
compare ``seconds_per_round`` / ``samples_per_second``. The ``--json`` record keeps what is needed
to pair the runs: workload and sizes, threads, torch version, machine, UTC date and the command.

Threads on a shared machine: torch's OpenMP threads busy-wait at every parallel region, so when
other processes already occupy the cores, ``--threads`` equal to the core count can make each step
many times slower than ``--threads 1`` (seen on the 2-core development machine: a batch-10 step
took 12 ms with 1 thread and 35-270 ms with 2 while another job used one core). Check the load
average in the record, and on a loaded machine give the figures at ``--threads 1`` as well.
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as error:  # the main jaxfl environment has no torch: skip, don't fail
    torch = None
    _TORCH_ERROR = error

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
EXPECTED_PARAMS = 1_199_882

WORKLOADS = {
    # clients: how many the 60,000 images are split into; per_round: sampled each round.
    "cross_device": dict(clients=1000, per_round=50, local_steps=6, batch_size=10, lr=0.1),
    "cross_silo": dict(clients=10, per_round=10, local_steps=50, batch_size=64, lr=0.1),
}
QUICK = {
    "cross_device": dict(per_round=4),
    "cross_silo": dict(local_steps=2),
}
QUICK_TEST_IMAGES = 1000


def read_idx(path: Path) -> np.ndarray:
    """One IDX file (gzip) as a numpy array: big-endian header, then unsigned bytes."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = data[0] | data[1], data[2], data[3]
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    return array.reshape(shape)


def load_split(data_dir: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images as (N, 1, 28, 28) float32 in [0, 1] and labels as int64."""
    images = read_idx(data_dir / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(data_dir / f"{prefix}-labels-idx1-ubyte.gz")
    x = (images.astype(np.float32) / 255.0)[:, None, :, :]
    return x, labels.astype(np.int64)


def make_model() -> "nn.Module":
    """PyTorch's MNIST example CNN without dropout (jaxfl's cnn_example)."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(),
        nn.Conv2d(32, 64, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(9216, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )


def accuracy(model: "nn.Module", x: "torch.Tensor", y: "torch.Tensor", batch: int = 1000) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="cross_device")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5; 2 with --quick)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="untimed rounds first (they train too; default 1)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch.set_num_threads (default: os.cpu_count() = %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write the record here")
    p.add_argument("--quick", action="store_true", help="a few-seconds smoke run (see the module docstring)")
    p.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    for flag, value, least in (("--rounds", args.rounds, 1), ("--warmup-rounds", args.warmup_rounds, 0),
                               ("--threads", args.threads, 1), ("--seed", args.seed, 0)):
        if value < least:
            p.error(f"{flag} {value} is not allowed: at least {least}")
    if torch is not None:  # without torch the run is skipped, whatever the folder
        missing = [f"{prefix}-{kind}-idx{dims}-ubyte.gz" for prefix in ("train", "t10k")
                   for kind, dims in (("images", 3), ("labels", 1))
                   if not (args.data_dir / f"{prefix}-{kind}-idx{dims}-ubyte.gz").is_file()]
        if missing:
            p.error(f"--data-dir {args.data_dir} is not allowed: "
                    f"{'no such folder' if not args.data_dir.is_dir() else 'it lacks ' + ', '.join(missing)}; "
                    "a folder holding the four Fashion-MNIST IDX files (.gz)")
    return args


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])


def machine() -> dict:
    return {"processor": platform.processor() or platform.machine(), "node": platform.node(),
            "platform": platform.platform(), "cpu_count": os.cpu_count()}


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (None where the OS has none): how shared the CPU was."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path | None, record: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {path}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if torch is None:
        reason = (f"torch is not installed in {sys.executable} ({_TORCH_ERROR}); install it in the benchmark's own "
                  "environment: python3 -m venv benchmarks/.venv-torch && "
                  "benchmarks/.venv-torch/bin/pip install torch==2.13.0 numpy")
        print(f"torch_loop: SKIPPED: {reason}")
        write_json(args.json, {"workload": args.workload, "skipped": reason, "date": utc_now(),
                               "command": command_line()})
        return 0

    cfg = dict(WORKLOADS[args.workload])
    if args.quick:
        cfg.update(QUICK[args.workload])
    n_clients, per_round, local_steps, batch_size, lr = (
        cfg["clients"], cfg["per_round"], cfg["local_steps"], cfg["batch_size"], cfg["lr"])
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # --- data and partition (untimed) ---
    x_train, y_train = load_split(args.data_dir, "train")
    x_test, y_test = load_split(args.data_dir, "t10k")
    if args.quick:
        x_test, y_test = x_test[:QUICK_TEST_IMAGES], y_test[:QUICK_TEST_IMAGES]
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(x_train))
    per_client = len(x_train) // n_clients
    xs = torch.from_numpy(np.ascontiguousarray(x_train[perm]))
    ys = torch.from_numpy(np.ascontiguousarray(y_train[perm]))
    client_x = [xs[c * per_client:(c + 1) * per_client] for c in range(n_clients)]
    client_y = [ys[c * per_client:(c + 1) * per_client] for c in range(n_clients)]
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)
    shuffle = torch.Generator().manual_seed(args.seed + 1)

    model = make_model()
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == EXPECTED_PARAMS, f"model has {n_params:,} parameters, expected {EXPECTED_PARAMS:,}"
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)  # plain SGD: no state carried between clients
    steps_per_round = per_round * local_steps
    threads = f"{args.threads} thread{'s' if args.threads != 1 else ''}"
    print(f"torch_loop {args.workload}{' (quick)' if args.quick else ''}: torch {torch.__version__}, "
          f"{threads}, {n_clients} clients x {per_client} images, {per_round} per round, "
          f"{local_steps} steps of batch {batch_size}, lr {lr}; {n_params:,} parameters; "
          f"{args.warmup_rounds} warm-up + {args.rounds} timed rounds")

    def fedavg_round() -> float:
        """One synchronous FedAvg round; returns the mean training loss over its client-steps."""
        global_state = {k: v.clone() for k, v in model.state_dict().items()}
        total = {k: torch.zeros_like(v) for k, v in global_state.items()}
        loss_sum = torch.zeros(())
        sampled = rng.choice(n_clients, size=per_round, replace=False)
        for c in sampled:
            model.load_state_dict(global_state)
            cx, cy = client_x[c], client_y[c]
            order = torch.randperm(len(cx), generator=shuffle)
            for step in range(local_steps):
                idx = order[torch.arange(step * batch_size, (step + 1) * batch_size) % len(cx)]
                optimizer.zero_grad()
                loss = F.cross_entropy(model(cx[idx]), cy[idx])
                loss.backward()
                optimizer.step()
                loss_sum += loss.detach()
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    total[k] += v
        model.load_state_dict({k: v / per_round for k, v in total.items()})
        return loss_sum.item() / steps_per_round

    for r in range(args.warmup_rounds):
        t0 = time.perf_counter()
        loss = fedavg_round()
        print(f"warm-up round {r + 1}: {time.perf_counter() - t0:.3f} s, train loss {loss:.4f}")
    seconds = []
    load_before = load_average()
    for r in range(args.rounds):
        t0 = time.perf_counter()
        loss = fedavg_round()
        seconds.append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds}: {seconds[-1]:.3f} s, {steps_per_round / seconds[-1]:.1f} client-steps/s, "
              f"{steps_per_round * batch_size / seconds[-1]:.0f} samples/s, train loss {loss:.4f}")

    median = statistics.median(seconds)
    load_after = load_average()
    t0 = time.perf_counter()
    acc = accuracy(model, x_test, y_test)
    eval_seconds = time.perf_counter() - t0
    record = {
        "workload": args.workload,
        "quick": args.quick,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "clients": n_clients,
        "samples_per_client": per_client,
        "clients_per_round": per_round,
        "local_steps": local_steps,
        "batch_size": batch_size,
        "lr": lr,
        "parameters": n_params,
        "seconds_per_round": median,
        "round_seconds": seconds,
        "client_steps_per_second": steps_per_round / median,
        "samples_per_second": steps_per_round * batch_size / median,
        "test_accuracy": acc,
        "test_images": len(x_test),
        "trained_rounds": args.warmup_rounds + args.rounds,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": machine(),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "date": utc_now(),
        "command": command_line(),
    }
    print(f"summary {args.workload}: median {median:.3f} s/round over {args.rounds} timed rounds, "
          f"{record['client_steps_per_second']:.1f} client-steps/s, {record['samples_per_second']:.0f} samples/s "
          f"({threads}, torch {torch.__version__}); test accuracy {acc:.4f} on {len(x_test):,} images "
          f"after {record['trained_rounds']} rounds (eval {eval_seconds:.1f} s, untimed)")
    write_json(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())

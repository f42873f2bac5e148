"""The CPU client step of the zoo's CNNs with narrow convolutions in im2col form or left to XLA (issue 17).

``jaxfl.kernels.cpu_ops.cpu_friendly`` rewrites a convolution as an im2col matrix product when its
contraction (kernel height × width × input channels) is at least ``MIN_IM2COL_CONTRACTION`` or, since
2026-11-29, when it has fewer than ``MIN_XLA_FEATURES`` output features (LeNet-5's first layer: 5x5 on
one channel to 6). Where no XLA convolution is left the engine runs a call's steps as one rolled
loop instead of unrolled chunks (XLA:CPU's own convolutions are several times slower inside a loop).
This script times one vmapped call of ``--steps`` steps for ``--clients`` clients, the engine's
trainer (``make_client_trainer(..., cpu_friendly_layers=True)``) and its loop choice, under the
rule before (``MIN_XLA_FEATURES = 0``: contraction alone) and now, side by side in one process
pinned to one core, the two sides taking turns ``--repeats`` times (best of each), with a PyTorch
reference where ``--torch PYTHON`` names an interpreter that has torch (LeNet-5 only).

    python benchmarks/narrow_convolutions.py                          # lenet5, cnn, fedasmu_cnn at batch 10 and 32
    python benchmarks/narrow_convolutions.py --models lenet5 --batch-sizes 32 --torch benchmarks/.venv-torch/bin/python
    python benchmarks/narrow_convolutions.py --evaluation --models lenet5 ccfedavg_cnn cnn cnn_example
    python benchmarks/narrow_convolutions.py --quick --json out.json   # smoke size (CI): lenet5, batch 2, 2 clients

``--evaluation`` times the held-out evaluation instead (``make_evaluator`` as the engine builds it,
``--images`` random images, default 10,000, every device of the process): the model's forward pass in XLA's forms, with
the whole rewrite (``cpu_friendly``) and with narrow convolutions only (``inference=True``), all
at 1,000 images a batch, and narrow convolutions only at the batch ``evaluation_batch_size`` picks
(what an evaluation on a CPU uses since 2026-11-29: patches within ``EVAL_PATCH_BYTES``), seconds per
evaluation, best of ``--repeats``, the forms taking turns.

``--quick`` is the smoke size (CI): LeNet-5 alone, and for the step batch 2, 2 clients, 2 steps, one
round (for ``--evaluation``, one round of 2,000 images); flags given with it keep their values. ``--json PATH`` writes
the table's rows with ``_report.run_header``'s machine, device, jax version and date.
"""
from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--evaluation" not in sys.argv:  # the step: one core, one device; an evaluation: as the engine runs it
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jaxfl.kernels import ClientView, FederatedArrays, cpu_ops, make_client_trainer  # noqa: E402
from jaxfl.engine import choose_step_loop  # noqa: E402
from jaxfl.models import as_adapter, make_model  # noqa: E402
from _report import check_at_least, run_header, write_json  # noqa: E402  (benchmarks/_report.py)

# the zoo's CIFAR models take 32x32x3 images; the others MNIST-shaped ones
CIFAR_SHAPED = {"ccfedavg_cnn", "fedasmu_cnn", "resnet18", "vgg11", "alexnet"}

TORCH_LENET = """
import sys, time, torch, torch.nn as nn
torch.set_num_threads(1)
batch, steps, repeats = (int(a) for a in sys.argv[1:4])
model = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Conv2d(16, 120, 5), nn.ReLU(), nn.Flatten(), nn.Linear(120, 84), nn.ReLU(),
                      nn.Linear(84, 10))
optimizer, loss = torch.optim.SGD(model.parameters(), lr=0.005), nn.CrossEntropyLoss()
x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
for layout in ("NCHW", "channels_last"):
    if layout == "channels_last":
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        for _ in range(steps * 5):
            optimizer.zero_grad(); loss(model(x), y).backward(); optimizer.step()
        best = min(best, (time.perf_counter() - start) / (steps * 5))
    print(f"{layout} {best * 1e3:.3f}")
"""


QUICK = {"models": ["lenet5"], "batch_sizes": [2], "clients": 2, "steps": 2, "repeats": 1, "images": 2_000}
DEFAULTS = {"models": ["lenet5", "cnn", "fedasmu_cnn"], "batch_sizes": [10, 32], "clients": 5, "steps": 10,
            "repeats": 3, "images": 10_000}


def input_shape(name: str) -> tuple[int, ...]:
    return (32, 32, 3) if name in CIFAR_SHAPED else (28, 28, 1)


def compile_call(name: str, batch: int, clients: int, steps: int):
    """The engine's step for ``clients`` vmapped clients, ``steps`` a call, in the loop the engine picks."""
    shape = input_shape(name)
    adapter = as_adapter(make_model(name, 10))
    variables = adapter.init_variables(jax.random.key(0), jnp.zeros((1,) + shape))
    trainer = make_client_trainer(adapter, optax.sgd(0.005), batch_size=batch, cpu_friendly_layers=True)
    rng = np.random.default_rng(0)
    samples = clients * batch * 4
    data = FederatedArrays(jnp.asarray(rng.integers(0, 256, (samples,) + shape, dtype=np.uint8)),
                           jnp.asarray(rng.integers(0, 10, samples).astype(np.int32)))
    views = ClientView(jnp.arange(clients, dtype=jnp.int32) * batch * 4, jnp.full((clients,), batch * 4, jnp.int32))
    stacked = jax.tree.map(lambda leaf: jnp.stack([leaf] * clients), variables)
    keys = jax.random.split(jax.random.key(1), clients)
    states = jax.vmap(lambda params, key: trainer.init(params, jnp.int32(10 ** 6), key))(stacked, keys)
    loop = choose_step_loop(trainer, variables, data, "cpu")
    batched = jax.vmap(trainer.step, in_axes=(0, None, 0))

    @jax.jit
    def call(states):
        if loop == "rolled":
            return jax.lax.fori_loop(0, steps, lambda _, carry: batched(carry, data, views), states)
        return jax.lax.scan(lambda carry, _: (batched(carry, data, views), None), states, None, length=steps,
                            unroll=True)[0]

    jax.block_until_ready(call(states))
    return call, states, loop


def time_evaluations(models: list[str], repeats: int, images: int) -> list[dict]:
    from jaxfl.experiment import EVAL_BATCH, evaluation_batch_size, make_evaluator

    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, jax {jax.__version__}, "
          f"{jax.device_count()} devices; seconds per evaluation of {images:,} images, best of {repeats}")
    print("| model | XLA's forms | whole rewrite | narrow convolutions only (inference=True) | the same at the "
          "cache-sized batch | batch |\n|---|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    rows = []
    for name in models:
        shape = input_shape(name)
        adapter = as_adapter(make_model(name, 10))
        variables = adapter.init_variables(jax.random.key(0), jnp.zeros((1,) + shape))
        x = rng.integers(0, 256, (images,) + shape, dtype=np.uint8)
        y = rng.integers(0, 10, images).astype(np.int32)
        narrow = cpu_ops.cpu_friendly(adapter.predict, inference=True)
        batch = evaluation_batch_size(adapter.predict, variables, shape, cpu_layers=True)
        forms = ((adapter.predict, EVAL_BATCH), (cpu_ops.cpu_friendly(adapter.predict), EVAL_BATCH),
                 (narrow, EVAL_BATCH), (narrow, batch))
        evaluators = [make_evaluator(form, x, y, size) for form, size in forms]
        best = [float("inf")] * len(forms)
        for evaluate in evaluators:
            evaluate(variables)  # compiled
        for _ in range(repeats):
            for index, evaluate in enumerate(evaluators):
                start = time.perf_counter()
                evaluate(variables)
                best[index] = min(best[index], time.perf_counter() - start)
        print(f"| {name} | " + " | ".join(f"{seconds:.3f}" for seconds in best) + f" | {batch} |", flush=True)
        rows.append({"model": name, "xla_s": best[0], "whole_rewrite_s": best[1], "narrow_only_s": best[2],
                     "narrow_only_cache_batch_s": best[3], "cache_batch": int(batch), "batch": EVAL_BATCH,
                     "images": images})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help="zoo models (default lenet5 cnn fedasmu_cnn; --quick: lenet5)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="batch per client (default 10 32; --quick: 2)")
    parser.add_argument("--clients", type=int, help="vmapped clients (default 5; --quick: 2)")
    parser.add_argument("--steps", type=int, help="steps a call (default 10; --quick: 2)")
    parser.add_argument("--repeats", type=int, help="rounds of the sides taking turns, best of them (default 3; "
                        "--quick: 1)")
    parser.add_argument("--core", type=int, help="the core to pin to (default: the last one allowed)")
    parser.add_argument("--torch", metavar="PYTHON", help="an interpreter with torch: LeNet-5's step in PyTorch too")
    parser.add_argument("--evaluation", action="store_true", help="time the held-out evaluation's forms instead")
    parser.add_argument("--images", type=int, help="held-out images an evaluation (--evaluation; default 10000; "
                        "--quick: 2000)")
    parser.add_argument("--quick", action="store_true", help="smoke size (CI): lenet5, batch 2, 2 clients, 2 steps, "
                        "1 round")
    parser.add_argument("--json", help="also write the rows, the machine, device, jax version and date here")
    args = parser.parse_args()
    check_at_least(parser, args, {"batch_sizes": 1, "clients": 1, "steps": 1, "repeats": 1, "images": 1})
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in args.models:
        try:
            make_model(name, 10)  # an unknown name fails here, before anything is timed
        except (KeyError, ValueError) as error:
            parser.error(f"--models {name} is not allowed: {error}")
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if args.core is not None and allowed is not None and args.core not in allowed:
        parser.error(f"--core {args.core} is not allowed: one of the cores this process may run on "
                     f"({', '.join(map(str, allowed))})")
    if args.torch and not os.path.exists(args.torch):
        parser.error(f"--torch {args.torch} is not allowed: no such file; a Python interpreter that has torch")
    settings = {key: getattr(args, key) for key in ("models", "batch_sizes", "clients", "steps", "repeats", "quick")}
    if args.evaluation:
        settings.pop("batch_sizes"), settings.pop("clients"), settings.pop("steps")
        settings["images"] = args.images
        rows = time_evaluations(args.models, args.repeats, args.images)
        write_json(args.json, {**run_header("narrow_convolutions --evaluation", **settings), "rows": rows})
        return
    if hasattr(os, "sched_setaffinity"):
        core = args.core if args.core is not None else max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, jax {jax.__version__}, one core, "
          f"{args.clients} vmapped clients, {args.steps} SGD steps a call, best of {args.repeats}; "
          f"ms per client step")
    print("| model | batch | before: loop | before ms | now: loop | now ms | before ÷ now "
          "| PyTorch NCHW / channels_last ms |")
    print("|---|---:|---|---:|---|---:|---:|---|")
    default = cpu_ops.MIN_XLA_FEATURES
    header = run_header("narrow_convolutions", **settings, core=core if hasattr(os, "sched_setaffinity") else None,
                        min_xla_features={"before": 0, "now": default})
    rows = []
    for name in args.models:
        for batch in args.batch_sizes:
            sides = {}
            for side, features in (("before", 0), ("now", default)):
                cpu_ops.MIN_XLA_FEATURES = features  # read when the step is traced
                try:
                    sides[side] = compile_call(name, batch, args.clients, args.steps)
                finally:
                    cpu_ops.MIN_XLA_FEATURES = default
            best = {side: float("inf") for side in sides}
            for _ in range(args.repeats):
                for side, (call, states, _) in sides.items():
                    start = time.perf_counter()
                    jax.block_until_ready(call(states))
                    best[side] = min(best[side], (time.perf_counter() - start) / (args.clients * args.steps) * 1e3)
            reference = ""
            if args.torch and name == "lenet5":
                done = subprocess.run([args.torch, "-c", TORCH_LENET, str(batch), str(args.steps), str(args.repeats)],
                                      capture_output=True, text=True, check=True)
                reference = " / ".join(line.split()[1] for line in done.stdout.splitlines())
            print(f"| {name} | {batch} | {sides['before'][2]} | {best['before']:.2f} | {sides['now'][2]} | "
                  f"{best['now']:.2f} | {best['before'] / best['now']:.2f} | {reference} |", flush=True)
            rows.append({"model": name, "batch": batch, "before_loop": sides["before"][2],
                         "before_ms_per_client_step": best["before"], "now_loop": sides["now"][2],
                         "now_ms_per_client_step": best["now"], "before_over_now": best["before"] / best["now"],
                         "torch_ms_nchw_channels_last": reference or None})
            write_json(args.json, {**header, "rows": rows})  # after each row: a run cut short keeps it


if __name__ == "__main__":
    main()

"""Client-steps per second: K clients trained in one vmapped call vs one client per call, against
the one-big-model limit, with model FLOP utilisation (issue 17, GPU target (a)).

Three sides, alternating within one run so that machine noise hits them alike (medians of
``--repeats``; compilation excluded, one warm-up each):

- **vmapped**: the real engine (``jaxfl.engine.Engine``, built as ``run_experiment`` builds it:
  a ``ModelAdapter`` trainer, ``ExecutionPlan``, ``sample_bytes`` for its memory guard). K
  dispatches of ``--steps`` local steps are queued, then ``flush()`` trains them all in one call
  (``clients_per_call=K``; the guard may split a call that does not fit: column ``split``);
- **one-by-one**: the same engine with ``clients_per_call=1``, the way APPFL, FLSim and FedScale
  train;
- **im2col** (with ``--im2col``): the vmapped engine with every convolution in im2col form
  (``make_client_trainer(..., cpu_friendly_layers=True, every_convolution=True)``; a CPU run takes
  it for all but wide layers with a small contraction): K
  clients' convolutions then become one batched matrix product each, where XLA's own vmapped
  convolution is a grouped one (``feature_group_count`` K, its kernel gradient ``batch_group_count``
  K), a path convolution libraries are known to run below their dense speed (not yet measured
  here on a GPU). The side is the whole CPU form, not its convolutions alone: the same switch also
  makes the max-pools reshapes and gives the dense layers their own gradient rule
  (:mod:`jaxfl.kernels.cpu_ops`), as a run that took it would. ``im2col/vec`` is its rate over the
  vmapped side's: above 1, the form an accelerator run should take (which of its three rewrites
  pays is a further measurement);
- **rolled** (with ``--rolled``): the vmapped engine with ``step_loop="rolled"``: every call's
  steps in one loop, which compiles one step where the unrolled chunk that accelerators take
  compiles ``--steps-per-call`` of them (XLA:GPU: 11-17 s for each of the CNN's 10-step programs on
  an H200, 2026-12-04). ``rolled/vec`` is its rate over the vmapped side's, and the row gives both
  engines' compile seconds: where it is near 1, the rolled loop is the better default there;
- **limit**: the same K·B samples per step trained as ONE model at batch K·B: the same kernel
  (``make_client_trainer`` of the same model and optimiser, batch K·B, one client holding every
  sample), in jitted unrolled chunks of ``--steps-per-call`` steps, the same number of steps. Its
  rate is given in client-steps/s equivalent (K × steps per second), and ``vec/limit`` is the
  vmapped rate over it: the share of the dense-batch speed that vectorised clients keep.

FLOPs come from XLA's cost analysis of the step lowered for the host's CPU
(``jit(...).lower(...).cost_analysis()["flops"]``, see :func:`step_flops`), whatever the device: one
client's training step at batch B (the vmapped and one-by-one sides do K of those per K
client-steps), and one step of the big model. XLA:GPU's compiled count left out the convolutions
and products it hands to cuDNN and cuBLAS (6.8x too low for the CNN, 175x for ResNet-18, on an H200).
TFLOP/s = FLOPs per client-step × client-steps/s; MFU = that ÷ the device's peak (``--peak-tflops``,
by default looked up from the device kind: H100/H200 SXM 989 dense bf16, the usual MFU
denominator; the JSON also gives it against the TF32 and FP32 peaks, since these models train in
float32). Where the device is not known, only TFLOP/s is printed.

Models: ``cnn`` (the FedCompass MNIST CNN, 582,026 parameters, on the embedded MNIST images) and
``resnet18`` (CIFAR ResNet-18 with BatchNorm, 11,173,962 parameters, BatchNorm statistics carried
as the engine carries them, on random CIFAR-shaped 32×32×3 uint8 data, 10 classes, no
augmentation). The samples are tiled until every client holds at least B of its own.

    python benchmarks/client_batching.py                          # cnn, K in 1 8 32 128, 10 steps
    python benchmarks/client_batching.py --model resnet18 --clients 1 8 32
    python benchmarks/client_batching.py --clients 1 8 --steps 5 --repeats 2 --json out.json
    python benchmarks/client_batching.py --clients 64 256 --im2col  # XLA's vmapped convolutions vs im2col
    python benchmarks/client_batching.py --clients 64 --rolled      # unrolled step chunks vs one rolled loop
    python benchmarks/client_batching.py --quick [--model resnet18]   # seconds-long smoke size (CI)
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxfl.data import load_dataset
from jaxfl.engine import Engine
from jaxfl.execution import ExecutionPlan, step_chunks
from jaxfl.experiment import make_client_optimizer
from jaxfl.kernels import FederatedArrays, make_client_trainer, make_server_optimizer
from jaxfl.kernels.client import ClientView
from jaxfl.models import count_params, make_model
from jaxfl.models.adapter import as_adapter
from jaxfl.scheduler.simulation import DispatchRecord
from _report import check_above, check_at_least, run_header, write_json  # benchmarks/_report.py

MODELS = {"cnn": {"shape": (28, 28, 1), "data": "mnist10k"},
          "resnet18": {"shape": (32, 32, 3), "data": "random CIFAR-shaped"}}
# Dense peak TFLOP/s by device kind (first match of the substring wins): bf16 (the usual MFU
# denominator), TF32 (what XLA:GPU's default float32 matmuls and convolutions run on) and FP32.
PEAKS = [("H100 PCIe", {"bf16": 756.0, "tf32": 378.0, "fp32": 51.0}),
         ("H100", {"bf16": 989.0, "tf32": 494.7, "fp32": 67.0}),  # SXM (HBM3); the NVL is close
         ("H200", {"bf16": 989.0, "tf32": 494.7, "fp32": 67.0}),
         ("H800", {"bf16": 989.0, "tf32": 494.7, "fp32": 67.0}),
         ("A100", {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5})]
QUICK = {"clients": [1, 2], "steps": 2, "steps_per_call": 2, "repeats": 1}
QUICK_BATCH = {"cnn": 64, "resnet18": 8}


def device_peaks(kind: str) -> dict | None:
    for name, peaks in PEAKS:
        if name.lower() in kind.lower():
            return peaks
    return None


def make_data(model_name: str, total: int) -> tuple[np.ndarray, np.ndarray]:
    """``total`` uint8 samples and labels: MNIST's (tiled) for the CNN, random CIFAR-shaped for ResNet-18."""
    if model_name == "cnn":
        dataset = load_dataset("mnist10k")
        base_x, base_y = dataset.train_x, dataset.train_y
    else:
        rng = np.random.default_rng(0)
        count = min(total, 4096)
        base_x = rng.integers(0, 256, (count,) + MODELS[model_name]["shape"], dtype=np.uint8)
        base_y = rng.integers(0, 10, count).astype(np.int32)
    repeats = -(-total // len(base_y))
    return np.concatenate([base_x] * repeats)[:max(total, len(base_y))], \
        np.concatenate([base_y] * repeats)[:max(total, len(base_y))]


class Setup:
    """The model, its initial variables and the K clients' data (each at least B samples of its own)."""

    def __init__(self, model_name: str, num_clients: int, batch_size: int, optimizer: str, lr: float):
        shape = MODELS[model_name]["shape"]
        self.model = as_adapter(make_model(model_name, 10))
        self.params = self.model.init_variables(jax.random.key(0), jnp.zeros((1,) + shape))
        self.optimizer = make_client_optimizer(optimizer, lr)
        self.batch_size = batch_size
        self.num_clients = num_clients
        x, y = make_data(model_name, num_clients * batch_size)
        self.total = len(y)
        self.data = FederatedArrays(jnp.asarray(x), jnp.asarray(y))
        per_client = self.total // num_clients
        self.offsets = np.arange(num_clients, dtype=np.int32) * per_client
        self.counts = np.full(num_clients, per_client, np.int32)
        self.sample_bytes = int(np.prod(shape))

    def engine(self, clients_per_call: int, steps_per_call: int, im2col: bool = False,
               step_loop: str | None = None) -> Engine:
        trainer = make_client_trainer(self.model, self.optimizer, self.batch_size, cpu_friendly_layers=im2col,
                                      every_convolution=im2col)
        return Engine(trainer, self.params, self.data, self.offsets, self.counts, make_server_optimizer(), seed=0,
                      plan=ExecutionPlan(clients_per_call, steps_per_call), sample_bytes=self.sample_bytes,
                      step_loop=step_loop)


def time_flush(engine: Engine, num_clients: int, steps: int, round_index: int) -> float:
    """Seconds to train ``num_clients`` queued dispatches: ``flush`` only queues the training calls
    (the engine reads their metrics when an aggregation needs them), so the clock stops when every
    dispatch's metrics, outputs of the same programs as the updates, have come back."""
    records = [DispatchRecord(id=round_index * num_clients + client, client=client, version=0, steps=steps,
                              client_round=round_index, start_time=0.0, arrival_time=1.0)
               for client in range(num_clients)]
    for record in records:
        engine.on_dispatch(record)
    start = time.perf_counter()
    engine.flush()
    trained = [engine.client_metrics(record.id) for record in records]  # waits for every queued call
    elapsed = time.perf_counter() - start
    if any(metrics is None for metrics in trained):
        raise RuntimeError("flush left a dispatch untrained: the timing would miss its work")
    for record in records:  # discard the updates so memory does not grow across repeats
        engine.on_drop(record)
    return elapsed


def flops_of(compiled_or_lowered) -> float | None:
    try:
        analysis = compiled_or_lowered.cost_analysis()
    except Exception:  # a backend without cost analysis
        return None
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0] if analysis else None
    flops = (analysis or {}).get("flops")
    return float(flops) if flops and flops > 0 else None


def step_flops(function, *args) -> tuple[float | None, str]:
    """FLOPs of ``function(*args)`` from XLA's cost analysis of the lowered (un-optimised) module,
    lowered for the host's CPU whatever the default backend: the count is of the program, not of a
    device's compilation of it. XLA:GPU's compiled count leaves out the convolutions and matrix
    products it hands to cuDNN and cuBLAS (on an H200, 2026-12-04: 0.234 GFLOP for the CNN's
    client-step at batch 64 and 1.063 for ResNet-18's, against 1.60 and 185.8 counted here), and
    it has no count of a lowered module; on XLA:CPU the lowered and compiled counts agree within 1 %.

    >>> flops, source = step_flops(lambda a, b: a @ b, jnp.ones((4, 8)), jnp.ones((8, 16)))
    >>> flops, source
    (1024.0, 'lowered for cpu')
    """
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    abstract = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=cpu), args)
    flops = flops_of(jax.jit(function).lower(*abstract))
    return flops, "lowered for cpu" if flops is not None else "none"


class BigModel:
    """The limit: one model trained on the K clients' K·B samples per step, as one batch of K·B."""

    def __init__(self, setup: Setup, steps: int, steps_per_call: int):
        big_batch = setup.num_clients * setup.batch_size
        self.trainer = make_client_trainer(setup.model, setup.optimizer, big_batch)
        self.setup, self.steps = setup, steps
        self.chunks = step_chunks(steps, steps_per_call)
        self.view = ClientView(jnp.int32(0), jnp.int32(setup.total))  # every sample, no masked position
        self._init = jax.jit(lambda params: self.trainer.init(params, steps, jax.random.key(1)))

        def chunk(state, data, view, length):
            for _ in range(length):  # unrolled, as the engine's chunks are
                state = self.trainer.step(state, data, view)
            return state

        self._chunk = jax.jit(chunk, static_argnums=3)

    def run(self) -> float:
        start = time.perf_counter()
        state = self._init(self.setup.params)
        for length in self.chunks:
            state = self._chunk(state, self.setup.data, self.view, length)
        jax.block_until_ready(state)
        return time.perf_counter() - start

    def flops_per_step(self) -> tuple[float | None, str]:
        """The lowered module's count: compiling the big batch's step again would cost as much as its chunk."""
        state = jax.eval_shape(self._init, self.setup.params)
        return step_flops(self.trainer.step, state, self.setup.data, self.view)


def client_step_flops(setup: Setup) -> tuple[float | None, str]:
    """FLOPs of one client's training step at batch B (what K vmapped clients do K of per step)."""
    trainer = make_client_trainer(setup.model, setup.optimizer, setup.batch_size)
    state = jax.eval_shape(lambda p: trainer.init(p, 1, jax.random.key(0)), setup.params)
    view = ClientView(jnp.int32(0), jnp.int32(setup.counts[0]))
    return step_flops(trainer.step, state, setup.data, view)


def is_out_of_memory(error: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or "out of memory" in str(error).lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--clients", type=int, nargs="+", help="K values (default 1 8 32 128; --quick: 1 2)")
    parser.add_argument("--steps", type=int, help="local steps per client (default 10)")
    parser.add_argument("--steps-per-call", type=int, help="unrolled steps per call (default 5)")
    parser.add_argument("--batch-size", type=int, help="B per client (default 64; --quick resnet18: 8)")
    parser.add_argument("--optimizer", default="adam", choices=("adam", "sgd", "adamw"), help="client optimiser")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--repeats", type=int, help="timed flushes per side, alternating (default 3)")
    parser.add_argument("--no-limit", action="store_true", help="skip the one-big-model limit")
    parser.add_argument("--im2col", action="store_true",
                        help="also time the vmapped engine in the CPU form (every convolution in im2col form, "
                             "batched matrix products instead of XLA's grouped convolutions; max-pools as "
                             "reshapes, dense layers' own gradient rule)")
    parser.add_argument("--peak-tflops", type=float,
                        help="the device's peak for MFU (default: by device kind, dense bf16; none: TFLOP/s only)")
    parser.add_argument("--rolled", action="store_true",
                        help="also time the vmapped clients with every call's steps in one rolled loop (one step "
                             "compiled) against the unrolled chunks an accelerator takes by default")
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke size (K 1 2, 2 steps, 1 repeat)")
    parser.add_argument("--json", help="also write the rows, machine, device, jax version, date and command here")
    args = parser.parse_args()
    check_at_least(parser, args, {"clients": 1, "steps": 1, "steps_per_call": 1, "batch_size": 1, "repeats": 1})
    check_above(parser, args, {"lr": 0, "peak_tflops": 0})
    defaults = QUICK if args.quick else {"clients": [1, 8, 32, 128], "steps": 10, "steps_per_call": 5, "repeats": 3}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch_size is None:
        args.batch_size = QUICK_BATCH[args.model] if args.quick else 64

    device = jax.devices()[0]
    peaks = device_peaks(device.device_kind)
    peak = args.peak_tflops if args.peak_tflops is not None else (peaks or {}).get("bf16")
    header = run_header("client_batching", model=args.model, data=MODELS[args.model]["data"], peak_tflops=peak,
                        peak_basis="--peak-tflops" if args.peak_tflops is not None else ("dense bf16" if peak else None),
                        device_peaks_tflops=peaks, args=vars(args))
    rows: list[dict] = []

    def save() -> None:  # after every row: a run cut short by a time limit keeps what it measured
        write_json(args.json, {**header, "rows": rows})

    first = Setup(args.model, 1, args.batch_size, args.optimizer, args.lr)
    header["parameters"] = count_params(first.params["params"])
    header["client_step_flops"], header["flops_source"] = client_step_flops(first)
    per_client_flops = header["client_step_flops"]
    against = f"{peak:g} TFLOP/s ({header['peak_basis']})" if peak else "no known peak (TFLOP/s only)"
    print(f"backend {jax.default_backend()} ({device.device_kind}), jax {jax.__version__}, {args.model} "
          f"({header['parameters']:,} parameters, {MODELS[args.model]['data']}), batch {args.batch_size}, "
          f"{args.optimizer}, {args.steps} local steps in chunks of {args.steps_per_call}, median of {args.repeats}; "
          f"{per_client_flops / 1e9 if per_client_flops else float('nan'):.3f} GFLOP per client-step "
          f"({header['flops_source']}); MFU against {against}",
          flush=True)
    print(f"{'K':>5} {'vmapped':>10} {'one-by-one':>11} {'ratio':>7} {'limit':>10} {'vec/limit':>9} "
          f"{'vec TFLOP/s':>11} {'vec MFU':>8} {'lim MFU':>8} {'split':>5}"
          + (f" {'im2col':>10} {'im2col/vec':>10} {'i2c/limit':>9}" if args.im2col else "")
          + (f" {'rolled':>10} {'rolled/vec':>10} {'compile s (vec/rolled)':>22}" if args.rolled else "")
          + "   (client-steps/s)")
    save()
    for num_clients in args.clients:
        setup = first if num_clients == 1 else Setup(args.model, num_clients, args.batch_size, args.optimizer, args.lr)
        batched = setup.engine(num_clients, args.steps_per_call)
        # at K = 1 the two plans are one program: one engine, compiled once, times both sides
        single = setup.engine(1, args.steps_per_call) if num_clients > 1 else batched
        im2col = setup.engine(num_clients, args.steps_per_call, im2col=True) if args.im2col else None
        rolled = setup.engine(num_clients, args.steps_per_call, step_loop="rolled") if args.rolled else None
        warmup = {"vmapped": time_flush(batched, num_clients, args.steps, 0),  # compilation included
                  "one_by_one": time_flush(single, num_clients, args.steps, 0)}
        if im2col is not None:
            warmup["im2col"] = time_flush(im2col, num_clients, args.steps, 0)
        if rolled is not None:
            warmup["rolled"] = time_flush(rolled, num_clients, args.steps, 0)
        limit, limit_note, limit_flops, limit_source = None, None, None, None
        if not args.no_limit:
            try:
                limit = BigModel(setup, args.steps, args.steps_per_call)
                warmup["limit"] = limit.run()  # compilation included
                limit_flops, limit_source = limit.flops_per_step()
            except Exception as error:  # noqa: BLE001 -- the big batch may not fit where K small ones do
                if not is_out_of_memory(error):
                    raise
                limit, limit_note = None, f"does not fit: {str(error).splitlines()[0][:200]}"
        batched_times, single_times, limit_times, im2col_times, rolled_times = [], [], [], [], []
        for repeat in range(1, args.repeats + 1):
            batched_times.append(time_flush(batched, num_clients, args.steps, repeat))
            single_times.append(time_flush(single, num_clients, args.steps, repeat))
            if im2col is not None:
                im2col_times.append(time_flush(im2col, num_clients, args.steps, repeat))
            if rolled is not None:
                rolled_times.append(time_flush(rolled, num_clients, args.steps, repeat))
            if limit is not None:
                limit_times.append(limit.run())
        work = num_clients * args.steps
        batched_rate = work / statistics.median(batched_times)
        single_rate = work / statistics.median(single_times)
        limit_rate = work / statistics.median(limit_times) if limit_times else None
        im2col_rate = work / statistics.median(im2col_times) if im2col_times else None
        rolled_rate = work / statistics.median(rolled_times) if rolled_times else None
        vec_tflops = per_client_flops * batched_rate / 1e12 if per_client_flops else None
        # the big model takes `steps` steps of limit_flops each in the time K clients take `steps` steps
        limit_tflops = limit_flops * limit_rate / num_clients / 1e12 if limit_flops and limit_rate else None
        row = {"clients": num_clients, "batch_size": args.batch_size, "steps": args.steps,
               "vmapped_client_steps_per_s": batched_rate, "one_by_one_client_steps_per_s": single_rate,
               "ratio": batched_rate / single_rate,
               "limit_client_steps_per_s": limit_rate,
               "vmapped_over_limit": batched_rate / limit_rate if limit_rate else None,
               "limit_note": limit_note,
               "vmapped_tflops": vec_tflops, "one_by_one_tflops":
                   per_client_flops * single_rate / 1e12 if per_client_flops else None,
               "limit_tflops": limit_tflops,
               "limit_step_flops": limit_flops, "limit_flops_source": limit_source,
               "vmapped_mfu": vec_tflops / peak if vec_tflops and peak else None,
               "limit_mfu": limit_tflops / peak if limit_tflops and peak else None,
               "mfu_by_peak": {basis: {"vmapped": vec_tflops / value if vec_tflops else None,
                                       "limit": limit_tflops / value if limit_tflops else None}
                               for basis, value in (peaks or {}).items()},
               "vmapped_calls_split_by_memory_guard": batched.split_calls,
               "vmapped_train_calls": batched.stats.train_calls,
               "im2col_client_steps_per_s": im2col_rate,
               "im2col_over_vmapped": im2col_rate / batched_rate if im2col_rate else None,
               "im2col_over_limit": im2col_rate / limit_rate if im2col_rate and limit_rate else None,
               "im2col_tflops": per_client_flops * im2col_rate / 1e12 if per_client_flops and im2col_rate else None,
               "im2col_calls_split_by_memory_guard": im2col.split_calls if im2col is not None else None,
               "rolled_client_steps_per_s": rolled_rate,
               "rolled_over_vmapped": rolled_rate / batched_rate if rolled_rate else None,
               "rolled_over_limit": rolled_rate / limit_rate if rolled_rate and limit_rate else None,
               # the warm-up flush is compilation plus one flush: the engines' own compile counters
               "compile_seconds": {"vmapped": batched.stats.compile_seconds,
                                   **({"rolled": rolled.stats.compile_seconds} if rolled is not None else {})},
               "vmapped_step_loop": batched.step_loop,
               "seconds": {"vmapped": batched_times, "one_by_one": single_times, "limit": limit_times,
                           "im2col": im2col_times, "rolled": rolled_times},
               "warmup_seconds": warmup}
        rows.append(row)
        fmt = lambda value, spec: f"{'—':>{int(spec[1:].split('.')[0])}}" if value is None else format(value, spec)
        print(f"{num_clients:>5} {batched_rate:>10.1f} {single_rate:>11.1f} {batched_rate / single_rate:>7.2f} "
              f"{fmt(limit_rate, '>10.1f')} {fmt(row['vmapped_over_limit'], '>9.2f')} {fmt(vec_tflops, '>11.3f')} "
              f"{fmt(row['vmapped_mfu'], '>8.2%')} {fmt(row['limit_mfu'], '>8.2%')} {batched.split_calls:>5}"
              + (f" {im2col_rate:>10.1f} {row['im2col_over_vmapped']:>10.2f} {fmt(row['im2col_over_limit'], '>9.2f')}"
                 if im2col_rate else "")
              + (f" {rolled_rate:>10.1f} {row['rolled_over_vmapped']:>10.2f} "
                 f"{batched.stats.compile_seconds:>11.1f}/{rolled.stats.compile_seconds:<10.1f}" if rolled_rate else "")
              + (f"  limit {limit_note}" if limit_note else ""), flush=True)
        save()
        del batched, single, limit, im2col, rolled  # free this K's device memory before the next K's engines
        gc.collect()
    print("\n| K | vmapped client-steps/s | one-by-one | vmapped ÷ one-by-one | one-big-model limit | vmapped ÷ limit "
          "| vmapped TFLOP/s | vmapped MFU | limit MFU |" + (" im2col | im2col ÷ vmapped | im2col ÷ limit |" if args.im2col else "")
          + (" rolled | rolled ÷ vmapped | compile s (vmapped / rolled) |" if args.rolled else "")
          + "\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if args.im2col else "")
          + ("---:|---:|---|" if args.rolled else ""))
    for row in rows:
        fmt = lambda value, spec: "—" if value is None else format(value, spec)
        print(f"| {row['clients']} | {row['vmapped_client_steps_per_s']:,.1f} | {row['one_by_one_client_steps_per_s']:,.1f} "
              f"| {row['ratio']:.2f} | {fmt(row['limit_client_steps_per_s'], ',.1f')} "
              f"| {fmt(row['vmapped_over_limit'], '.2f')} | {fmt(row['vmapped_tflops'], '.3f')} "
              f"| {fmt(row['vmapped_mfu'], '.2%')} | {fmt(row['limit_mfu'], '.2%')} |"
              + (f" {fmt(row['im2col_client_steps_per_s'], ',.1f')} | {fmt(row['im2col_over_vmapped'], '.2f')} "
                 f"| {fmt(row['im2col_over_limit'], '.2f')} |" if args.im2col else "")
              + (f" {fmt(row['rolled_client_steps_per_s'], ',.1f')} | {fmt(row['rolled_over_vmapped'], '.2f')} "
                 f"| {row['compile_seconds']['vmapped']:.1f} / {fmt(row['compile_seconds'].get('rolled'), '.1f')} |"
                 if args.rolled else ""))


if __name__ == "__main__":
    main()

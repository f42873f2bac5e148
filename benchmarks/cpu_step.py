"""One client's training step of the cross-device CNN on one CPU core, in several formulations side by side
(issue 17, target 1: what makes the XLA:CPU step cheaper).

The program timed is the one the engine compiles for each CPU device on the ``cross_device`` workload
of ``cpu_speed.py``: PyTorch's MNIST example CNN (``cnn_example``, 1.2 M parameters), plain SGD at
lr 0.1, one vmapped client, its 6 local steps of batch 10 drawn from its 60 samples in one unrolled
6-step call: the engine's call for this workload on a CPU (the example CNN keeps an XLA convolution,
so the engine runs unrolled chunks, and clients that share the 6-step count fill one 6-step chunk:
no padding step is computed). The step count is passed at run time in the client's state, as the
engine passes it, so every step still evaluates the trainer's ``step < num_steps`` guard (a select
per parameter and optimiser leaf), though here all 6 steps are active. Each formulation is compiled once, then the
formulations take turns (``--repeats`` rounds of ``--calls`` calls each, so that a shared machine's
load hits all of them) and the table gives the median milliseconds per step, wall and CPU (the
process's CPU time: steadier than wall time when other jobs share the cores), with the load average.

Formulations (the same parameter pytree, the same float32 arithmetic up to reassociation):

- ``xla``: the model as flax writes it (XLA's convolutions and ``reduce_window`` max-pool);
- ``default``: what the engine runs on a CPU (``cpu_friendly``: im2col convolution whose patches are
  built in one fused loop, reshape max-pool with XLA's first-maximum gradient in one fused loop,
  dense products with a transpose-free kernel gradient);
- ``reshape_pool``: ``default`` with the pool's gradient as JAX's rule for a max over the reshaped
  axes (the engine's CPU default before: a mask, its count and a division, tied maxima sharing);
- ``minor_concat``: ``default`` with the patches as 9 windows concatenated on the channel axis (the
  engine's CPU default before: XLA:CPU writes out each window, then copies them all again);
- ``no_dense``: ``default`` without the dense rewrite;
- ``xla_conv``: ``default`` but the wide convolution left to XLA (only the pool and dense rewrites);
- hand-written models on the same parameters: ``nchw`` (the wide convolution in NCHW/OIHW layout),
  ``patches`` (im2col by ``lax.conv_general_dilated_patches``), ``rows`` (im2col per kernel row: three
  matrix products of a third of the size), ``pairwise_pool`` (the pool as a tree of ``maximum``),
  ``select_pool`` (the pool with a gradient rule that routes ``g`` to every window maximum),
  ``conv_dense`` (the im2col product with the dense rule: its kernel gradient Pᵀg in the kernel's
  layout), ``conv_custom`` (a gradient rule giving the input's gradient as XLA's transposed
  convolution), ``padsum`` (the patches as the sum of the 9 windows each padded to 288 channels) —
  each with the dense rewrite and, but for ``rows`` and ``padsum``, the fused patches, so that they
  compare with ``default``.

``--profile VARIANT …`` prints where the formulations' steps go instead, side by side: XLA:CPU's own
trace of each operation (``--xla_cpu_enable_xprof_traceme``), summed per step by the operation's
kind, shape and source, the formulations traced in turn ``--repeats`` times (medians), the first
one's costliest operations first, then those of the others that it lacks (the timings include the
tracing's overhead).

``--flags`` times ``default`` once per XLA_FLAGS setting instead, each in its own process (flags are
read when jax starts its backend), the settings taking turns ``--repeats`` times.

Pinning: every process runs on one core (``--core``, default the last) with Eigen single-threaded
and one jax CPU device, i.e. one engine device. ``--devices N`` runs the program on N jax CPU devices
at once instead (one client each, dispatched from one Python thread without waiting, as the engine
does; not pinned), which with ``--flags`` compares thread settings of the devices.

    python benchmarks/cpu_step.py                                   # every formulation, ~3 min
    python benchmarks/cpu_step.py --variants default no_dense xla --repeats 7
    python benchmarks/cpu_step.py --flags none xla_cpu_use_xnnpack=false --repeats 2   # flags without "--"
    python benchmarks/cpu_step.py --profile default reshape_pool --repeats 3   # the 20 costliest operations
    CPU_STEP_BATCH=64 python benchmarks/cpu_step.py --variants default no_dense   # cross_silo's batch
    python benchmarks/cpu_step.py --devices 2 --flags xla_cpu_multi_thread_eigen=true xla_cpu_multi_thread_eigen=false
    python benchmarks/cpu_step.py --quick --json step.json   # smoke size (CI): `default`, 1 round of 1 call

``--json PATH`` writes the rows (timings, flag settings or profiled operations) with
``_report.run_header``'s machine, device, jax version and date.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from _report import check_at_least, run_header, write_json  # benchmarks/_report.py (jax imported when used)

ONE_CORE_FLAGS = "--xla_cpu_multi_thread_eigen=false"
STEPS = 6


def _pin(core: int | None) -> None:
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[-1] if core is None else core})


# ------------------------------------------------------------------ hand-written formulations
def _hand_written(variant: str):
    """apply(variables, x) of the example CNN for a hand-written variant (same parameter pytree)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from jaxfl.kernels.cpu_ops import _patches, dense_product

    nhwc = ("NHWC", "HWIO", "NHWC")

    def conv_xla(x, kernel):
        return lax.conv_general_dilated(x, kernel, (1, 1), "VALID", dimension_numbers=nhwc)

    def windows(x, kh, kw, rows=None):
        out_h, out_w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
        return [x[:, i:i + out_h, j:j + out_w, :] for i in (range(kh) if rows is None else rows) for j in range(kw)]

    def patches(x, kh, kw):  # cpu_friendly's (one fused loop)
        return _patches(x, kh, kw, 1, 1, x.shape[1] - kh + 1, x.shape[2] - kw + 1)

    def conv_im2col(x, kernel):
        kh, kw, c, o = kernel.shape
        return patches(x, kh, kw) @ kernel.reshape(kh * kw * c, o)

    def conv_im2col_dense(x, kernel):
        kh, kw, c, o = kernel.shape
        return dense_product(patches(x, kh, kw), kernel.reshape(kh * kw * c, o))

    @jax.custom_vjp
    def conv_custom(x, kernel):
        return conv_im2col(x, kernel)

    def _conv_custom_forward(x, kernel):
        kh, kw, c, o = kernel.shape
        columns = patches(x, kh, kw)
        return columns @ kernel.reshape(kh * kw * c, o), (columns, kernel)

    def _conv_custom_backward(residuals, g):
        columns, kernel = residuals
        kh, kw, c, o = kernel.shape
        kernel_grad = jax.lax.dot_general(columns, g, (((0, 1, 2), (0, 1, 2)), ((), ()))).reshape(kernel.shape)
        # the input's gradient as XLA's transposed convolution of g with the flipped kernel
        x_grad = lax.conv_general_dilated(g, jnp.flip(kernel, (0, 1)).swapaxes(2, 3), (1, 1),
                                          ((kh - 1, kh - 1), (kw - 1, kw - 1)), dimension_numbers=nhwc)
        return x_grad, kernel_grad

    conv_custom.defvjp(_conv_custom_forward, _conv_custom_backward)

    def conv_padsum(x, kernel):
        kh, kw, c, o = kernel.shape
        parts = windows(x, kh, kw)
        columns = sum(jnp.pad(w, ((0, 0), (0, 0), (0, 0), (k * c, (kh * kw - 1 - k) * c))) for k, w in enumerate(parts))
        return columns @ kernel.reshape(kh * kw * c, o)

    def conv_nchw(x, kernel):
        y = lax.conv_general_dilated(jnp.transpose(x, (0, 3, 1, 2)), jnp.transpose(kernel, (3, 2, 0, 1)), (1, 1),
                                     "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jnp.transpose(y, (0, 2, 3, 1))

    def conv_patches(x, kernel):
        kh, kw, c, o = kernel.shape
        columns = lax.conv_general_dilated_patches(x, (kh, kw), (1, 1), "VALID", dimension_numbers=nhwc)
        return columns @ jnp.transpose(kernel, (2, 0, 1, 3)).reshape(c * kh * kw, o)  # channel-major patches

    def conv_rows(x, kernel):
        kh, kw, c, o = kernel.shape
        return sum(jnp.concatenate(windows(x, kh, kw, rows=[i]), axis=-1) @ kernel[i].reshape(kw * c, o)
                   for i in range(kh))

    def pool_reshape(x):
        n, h, w, c = x.shape
        return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))

    def pool_pairwise(x):
        n, h, w, c = x.shape
        y = x.reshape(n, h // 2, 2, w // 2, 2, c)
        return jnp.maximum(jnp.maximum(y[:, :, 0, :, 0], y[:, :, 0, :, 1]), jnp.maximum(y[:, :, 1, :, 0], y[:, :, 1, :, 1]))

    @jax.custom_vjp
    def pool_select(x):
        return pool_reshape(x)

    def _upsample(a, shape):
        n, h, w, c = shape
        return jnp.broadcast_to(a[:, :, None, :, None, :], (n, h // 2, 2, w // 2, 2, c)).reshape(shape)

    pool_select.defvjp(lambda x: (pool_reshape(x), (x, pool_reshape(x))),
                       lambda res, g: (jnp.where(res[0] == _upsample(res[1], res[0].shape), _upsample(g, res[0].shape), 0.0),))

    conv, pool = {"nchw": (conv_nchw, pool_reshape), "patches": (conv_patches, pool_reshape),
                  "rows": (conv_rows, pool_reshape), "pairwise_pool": (conv_im2col, pool_pairwise),
                  "select_pool": (conv_im2col, pool_select),
                  "conv_dense": (conv_im2col_dense, pool_reshape),
                  "conv_custom": (conv_custom, pool_reshape), "padsum": (conv_padsum, pool_reshape)}[variant]

    def apply(variables, x):
        p = variables["params"]
        x = jax.nn.relu(conv_xla(x, p["Conv_0"]["kernel"]) + p["Conv_0"]["bias"])  # 1 channel: XLA's (as cpu_friendly)
        x = jax.nn.relu(conv(x, p["Conv_1"]["kernel"]) + p["Conv_1"]["bias"])
        x = pool(x).reshape(x.shape[0], -1)
        x = jax.nn.relu(dense_product(x, p["Dense_0"]["kernel"]) + p["Dense_0"]["bias"])
        return dense_product(x, p["Dense_1"]["kernel"]) + p["Dense_1"]["bias"]

    return apply


HAND_WRITTEN = ("nchw", "patches", "rows", "pairwise_pool", "select_pool", "conv_dense", "conv_custom", "padsum")
CPU_FRIENDLY = ("default", "reshape_pool", "minor_concat", "no_dense", "xla_conv")
VARIANTS = CPU_FRIENDLY + ("xla",) + HAND_WRITTEN


def _minor_axis_patches(x, kh, kw, sh, sw, out_h, out_w):
    """The im2col patches as cpu_friendly built them before: kh·kw windows concatenated on the channel axis."""
    import jax.numpy as jnp

    return jnp.concatenate([x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, :]
                            for i in range(kh) for j in range(kw)], axis=-1)


def _reshape_max(x, window):
    """The tiling max-pool as cpu_friendly wrote it before: a max over the reshaped axes with JAX's
    gradient rule (the cotangent split among tied maxima: an equality mask, its count, a division)."""
    import jax.numpy as jnp

    x = x[tuple(slice(0, size - size % w) for size, w in zip(x.shape, window))]
    shape = [part for size, w in zip(x.shape, window) for part in (size // w, w)]
    return jnp.max(x.reshape(shape), axis=tuple(range(1, 2 * x.ndim, 2)))


@contextlib.contextmanager
def _rewrites(dense: bool = True, im2col: bool = True, fused_patches: bool = True, pool_rule: bool = True):
    """Switch cpu_friendly's dense or im2col rewrite off, its patches back to the minor-axis
    concatenation, or its max-pool's gradient rule back to JAX's for a max over the reshaped
    axes, while the step is traced (benchmark only)."""
    from jaxfl.kernels import cpu_ops

    saved = cpu_ops._is_dense, cpu_ops._im2col_applies, cpu_ops._patches, cpu_ops._tiled_max
    if not pool_rule:
        cpu_ops._tiled_max = _reshape_max
    if not dense:
        cpu_ops._is_dense = lambda eqn: False
    if not im2col:
        cpu_ops._im2col_applies = lambda eqn: False
    if not fused_patches:
        cpu_ops._patches = _minor_axis_patches
    try:
        yield
    finally:
        cpu_ops._is_dense, cpu_ops._im2col_applies, cpu_ops._patches, cpu_ops._tiled_max = saved


def compile_variant(variant: str, device=None):
    """(the compiled 6-step call of one vmapped client, its arguments) for a formulation, on ``device``
    (default: the first)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from jaxfl.kernels.client import ClientView, FederatedArrays, make_client_trainer
    from jaxfl.models import make_model

    model = make_model("cnn_example", 10)
    apply = _hand_written(variant) if variant in HAND_WRITTEN else model.apply
    trainer = make_client_trainer(apply, optax.sgd(0.1), batch_size=int(os.environ.get("CPU_STEP_BATCH", 10)),
                                  cpu_friendly_layers=variant in CPU_FRIENDLY)
    params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 1)))
    rng = np.random.default_rng(0)
    data = FederatedArrays(jnp.asarray(rng.integers(0, 256, (6000, 28, 28, 1), dtype=np.uint8)),
                           jnp.asarray(rng.integers(0, 10, 6000), dtype=jnp.int32))
    view = ClientView(jnp.array([120], jnp.int32), jnp.array([60], jnp.int32))
    batched_step = jax.vmap(trainer.step, in_axes=(0, None, 0))

    def call(params, num_steps, key):
        states = jax.vmap(trainer.init)(jax.tree.map(lambda leaf: leaf[None], params), num_steps, key[None])
        states, _ = jax.lax.scan(lambda carry, _: (batched_step(carry, data, view), None), states, None,
                                 length=STEPS, unroll=True)
        return jax.tree.map(lambda leaf: leaf[0], states.params)

    arguments = jax.device_put((params, jnp.array([STEPS], jnp.int32), jax.random.key(1)), device or jax.devices()[0])
    with _rewrites(dense=variant != "no_dense", im2col=variant != "xla_conv", fused_patches=variant != "minor_concat",
                   pool_rule=variant != "reshape_pool"):
        compiled = jax.jit(call).lower(*arguments).compile()
    return compiled, arguments


def time_variants(variants, repeats: int, calls: int) -> dict:
    """Median wall and CPU ms per step of each formulation, on every jax device at once (one client
    per device, one Python thread dispatching to all of them without waiting, as the engine does);
    wall ms per step is the wall time over the steps of all devices."""
    import jax

    compiled = {}
    for variant in variants:
        started = time.perf_counter()
        compiled[variant] = [compile_variant(variant, device) for device in jax.devices()]
        jax.block_until_ready([function(*arguments) for function, arguments in compiled[variant]])
        print(f"  {variant}: compiled and run once in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    wall = {variant: [] for variant in variants}
    cpu = {variant: [] for variant in variants}
    loads = []
    for _ in range(repeats):
        for variant in variants:
            states = [arguments[0] for _, arguments in compiled[variant]]
            wall_0, cpu_0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                states = [function(state, num_steps, key)
                          for (function, (_, num_steps, key)), state in zip(compiled[variant], states)]
            jax.block_until_ready(states)
            steps = calls * STEPS * len(states)
            wall[variant].append((time.perf_counter() - wall_0) / steps * 1e3)
            cpu[variant].append((time.process_time() - cpu_0) / steps * 1e3)
        loads.append(os.getloadavg()[0])
    return {variant: {"wall_ms": statistics.median(wall[variant]), "cpu_ms": statistics.median(cpu[variant]),
                      "cpu_ms_min": min(cpu[variant])} for variant in variants} | {"load": (min(loads), max(loads))}


def _trace_per_step(function, arguments, described: dict, calls: int) -> collections.Counter:
    """Microseconds per step of each described operation in XLA:CPU's trace of ``calls`` calls."""
    import jax

    params, num_steps, key = arguments
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(calls):
                params = function(params, num_steps, key)
            jax.block_until_ready(params)
        with gzip.open(glob.glob(os.path.join(folder, "**", "*.trace.json.gz"), recursive=True)[0]) as handle:
            events = json.load(handle)
    events = events["traceEvents"] if isinstance(events, dict) else events
    microseconds = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("name") in described:
            microseconds[described[event["name"]]] += event.get("dur", 0) / calls / STEPS
    return microseconds


def _describe(function) -> tuple[dict, collections.Counter]:
    """HLO instruction name → "opcode shape source" of a compiled call's entry computation, and how
    often each description occurs per step."""
    text = function.as_text()
    described = {}
    for line in text[text.index("\nENTRY"):].splitlines():
        match = re.match(r"\s*%?([\w.\-]+) = (\S+) ([\w\-]+)\(", line)
        if match:
            source = re.search(r'op_name="([^"]+)"', line)
            described[match.group(1)] = (f"{match.group(3)} {match.group(2).split('{')[0]} "
                                         f"{source.group(1).split('/')[-1] if source else ''}").strip()
    return described, collections.Counter(described.values())


def profile(variants, calls: int, repeats: int = 1, top: int = 20) -> list[dict]:
    """Print the costliest operations of each formulation's step from XLA:CPU's trace, side by side
    (the formulations traced in turn ``repeats`` times; medians), and return the table's rows."""
    import jax

    compiled = {}
    for variant in variants:
        function, arguments = compile_variant(variant)
        for _ in range(2):
            arguments = (function(*arguments),) + arguments[1:]
        jax.block_until_ready(arguments)
        compiled[variant] = (function, arguments, *_describe(function))
    traced = {variant: [] for variant in variants}
    loads = []
    for _ in range(repeats):
        for variant, (function, arguments, described, _) in compiled.items():
            traced[variant].append(_trace_per_step(function, arguments, described, calls))
        loads.append(os.getloadavg()[0])
    median = {variant: collections.Counter({operation: statistics.median(run[operation] for run in runs)
                                            for operation in set().union(*runs)})
              for variant, runs in traced.items()}
    print(f"ms per step in XLA's operations, load average {min(loads):.1f}–{max(loads):.1f}: "
          + ", ".join(f"{variant} {sum(costs.values()) / 1e3:.2f}" for variant, costs in median.items()))
    first = median[variants[0]]
    rows = [operation for operation, _ in first.most_common(top)]
    for costs in list(median.values())[1:]:  # the others' costliest operations that the first lacks
        rows += [operation for operation, _ in costs.most_common(top) if operation not in rows][:top // 2]
    print("| " + " | ".join(f"{variant} ms/step" for variant in variants) + " | per step | operation (kind, shape, "
          "source) |\n|" + "---:|" * (len(variants) + 1) + "---|")
    table = []
    for operation in rows:
        count = max(compiled[variant][3][operation] for variant in variants) / STEPS
        print("| " + " | ".join(f"{median[variant][operation] / 1e3:.3f}" if operation in median[variant] else ""
                                for variant in variants) + f" | {count:.1f} | {operation} |")
        table.append({"operation": operation, "per_step": count,
                      "ms_per_step": {variant: round(median[variant][operation] / 1e3, 4)
                                      for variant in variants if operation in median[variant]}})
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS,
                        help="the formulations to time (default: all of them; --quick: default)")
    parser.add_argument("--flags", nargs="+", metavar="FLAG", help="time `default` under each of these XLA "
                        "flags, written without their leading -- (`none`: no flag; `a=1,b=2`: two at once), each "
                        "in its own process, instead of the formulations")
    parser.add_argument("--repeats", type=int, help="rounds of the formulations taking turns (default 5; --quick: 1)")
    parser.add_argument("--calls", type=int, help="6-step calls per timing (default 5; --quick: 1)")
    parser.add_argument("--core", type=int, help="the core to pin to (default: the last one allowed)")
    parser.add_argument("--devices", type=int, default=1, help="run on this many jax CPU devices at once, one "
                        "client each, as the engine does (no pinning; XLA_FLAGS as given, or as jaxfl sets them)")
    parser.add_argument("--profile", nargs="+", choices=VARIANTS, metavar="VARIANT", help="print where these "
                        "formulations' steps go (XLA:CPU's trace per operation, side by side, traced in turn "
                        "--repeats times) instead of timing them")
    parser.add_argument("--quick", action="store_true", help="smoke size (CI): --variants default (unless given), "
                        "1 round of 1 call")
    parser.add_argument("--json", help="also write the rows, the machine, device, jax version and date here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    check_at_least(parser, args, {"repeats": 1, "calls": 1, "devices": 1})
    if not hasattr(os, "sched_getaffinity"):
        parser.error("this benchmark times steps pinned to one core (CPU affinity), which only Linux offers")
    allowed = sorted(os.sched_getaffinity(0))
    if args.core is not None and args.core not in allowed:
        parser.error(f"--core {args.core} is not allowed: one of the cores this process may run on "
                     f"({', '.join(map(str, allowed))})")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5
    if args.calls is None:
        args.calls = 1 if args.quick else 5
    if args.variants is None:
        args.variants = ["default"] if args.quick else list(VARIANTS)
    run_settings = {"variants": args.variants, "repeats": args.repeats, "calls": args.calls, "devices": args.devices,
                "quick": args.quick, "batch": int(os.environ.get("CPU_STEP_BATCH", 10)), "steps_per_call": STEPS}

    if args.flags:
        settings = [" ".join(f"--{flag}" for flag in setting.split(",")) if setting != "none" else ""
                    for setting in args.flags]
        rows = {flags: [] for flags in settings}
        for _ in range(args.repeats):
            for flags in settings:
                command = [sys.executable, __file__, "--child", "--variants", "default", "--repeats", "1",
                           "--calls", str(args.calls), "--devices", str(args.devices)] \
                    + ([] if args.core is None else ["--core", str(args.core)])
                base = ONE_CORE_FLAGS if args.devices == 1 else ""
                environment = dict(os.environ, XLA_FLAGS=f"{base} {flags}".strip(), JAXFL_CPU_DEVICES=str(args.devices))
                done = subprocess.run(command, capture_output=True, text=True, env=environment)
                if done.returncode != 0:
                    rows[flags].append(None)
                    print(f"  [{flags}] failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                    continue
                wall_ms, cpu_ms, load = map(float, done.stdout.split()[-3:])
                rows[flags].append((wall_ms, cpu_ms, load))
        print(("| XLA_FLAGS (besides " + ONE_CORE_FLAGS + ")" if args.devices == 1 else
               f"| XLA_FLAGS ({args.devices} devices)") + " | wall ms/step | CPU ms/step | load average |\n|---|---:|---:|---|")
        for flags, runs in rows.items():
            done_runs = [run for run in runs if run]
            if not done_runs:
                print(f"| `{flags or '(none)'}` | failed | failed | |")
                continue
            print(f"| `{flags or '(none)'}` | {statistics.median(r[0] for r in done_runs):.2f} | "
                  f"{statistics.median(r[1] for r in done_runs):.2f} | "
                  f"{min(r[2] for r in done_runs):.1f}–{max(r[2] for r in done_runs):.1f} |")
        # the children's backend: the header's device is this parent's (jax is only started here for it)
        header = run_header("cpu_step --flags", **{**run_settings, "variants": ["default"]},
                            base_flags=ONE_CORE_FLAGS if args.devices == 1 else "")
        write_json(args.json, {**header,
                               "rows": [{"xla_flags": flags, "runs": [None if run is None else
                                                                       dict(zip(("wall_ms", "cpu_ms", "load"), run))
                                                                       for run in runs]}
                                        for flags, runs in rows.items()]})
        return

    os.environ["JAXFL_CPU_DEVICES"] = str(args.devices)
    if args.devices == 1 and ONE_CORE_FLAGS not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{ONE_CORE_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
    if args.profile:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_enable_xprof_traceme=true".strip()
    if args.devices == 1:
        _pin(args.core)
    import importlib

    import jax

    importlib.import_module("jaxfl")  # its device settings, before jax's backends start

    if args.profile:
        rows = profile(args.profile, args.calls, args.repeats)
        write_json(args.json, {**run_header("cpu_step --profile", **{**run_settings, "variants": args.profile},
                                            xla_flags=os.environ.get("XLA_FLAGS", "")), "rows": rows})
        return

    results = time_variants(args.variants, args.repeats, args.calls)
    low, high = results.pop("load")
    if args.child:
        only = results["default"]
        print(f"{only['wall_ms']:.3f} {only['cpu_ms']:.3f} {high:.2f}")
        return
    where = "one core" if args.devices == 1 else f"{len(jax.devices())} devices at once"
    print(f"jax {jax.__version__}, {where}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, load average {low:.1f}–{high:.1f}")
    print("| formulation | wall ms/step | CPU ms/step | CPU ms/step, best | CPU vs default |\n|---|---:|---:|---:|---:|")
    reference = results.get("default", next(iter(results.values())))["cpu_ms"]
    rows = []
    for variant, row in results.items():
        print(f"| {variant} | {row['wall_ms']:.2f} | {row['cpu_ms']:.2f} | {row['cpu_ms_min']:.2f} | "
              f"{row['cpu_ms'] / reference:.2f}× |")
        rows.append({"formulation": variant, "wall_ms_per_step": round(row["wall_ms"], 4),
                     "cpu_ms_per_step": round(row["cpu_ms"], 4), "cpu_ms_per_step_best": round(row["cpu_ms_min"], 4),
                     "cpu_vs_default": round(row["cpu_ms"] / reference, 4)})
    write_json(args.json, {**run_header("cpu_step", **run_settings, xla_flags=os.environ.get("XLA_FLAGS", ""),
                                        load_average=[low, high]), "rows": rows})


if __name__ == "__main__":
    main()

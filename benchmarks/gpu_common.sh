# Sourced by the GPU buttons (gpu_suite.sh, gpu_extra.sh): the shared set-up — the repository root
# as the working directory and on PYTHONPATH, $OUT, the device's description in $OUT/device.txt —
# preflight(), which stops the button within a minute where jaxfl cannot run on the device, and
# step(), which runs one benchmark under its own time limit so that one slow step cannot eat the
# device tool's whole 600 s call.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
QUICK="${QUICK:-}"  # QUICK=1: a smoke run at the scripts' --quick sizes (CPU is fine)
started=$SECONDS

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  python3 -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  python3 -c "import importlib.util as u; print('packages:', {m: bool(u.find_spec(m)) for m in ('orbax.checkpoint', 'pyarrow', 'tqdm')})"
  nproc; free -g | head -2
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

say() {  # say TEXT: print a line and add it to $OUT/log.txt
  echo "$*" | tee -a "$OUT/log.txt"
}

step() {  # step NAME LIMIT_S COMMAND...: run one benchmark under its own limit, its output added to $OUT/log.txt
  # (one log for all steps: the device tool brings back at most 8 files from $OUT)
  local name=$1 limit=$2; shift 2
  say "=== $name (limit ${limit} s, suite at $((SECONDS - started)) s)"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/log.txt"
  local status=${PIPESTATUS[0]}
  [ "$status" -eq 124 ] && say "=== $name: cut at its ${limit} s limit (what it finished is in its JSON)"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && say "=== $name: exit status $status"
  return 0
}

preflight() {  # preflight LIMIT_S: a 2-update jaxfl run on the device, or stop the button here
  # The device machine's jax is not the one CI tests (0.11.x there in 2026-11, 0.10.2 here), and
  # a jax whose CUDA plugin fails falls back to the CPU with a warning: either would spend the whole
  # lease on failures or on CPU figures. One small run of the engine, an evaluation and a checkpoint
  # (the pieces every step uses) finds both in seconds, and the session keeps its time to mend and
  # rerun. QUICK=1 allows the CPU.
  local limit=$1
  say "=== preflight (limit ${limit} s)"
  timeout "$limit" python3 - "$QUICK" <<'PYTHON' 2>&1 | tee -a "$OUT/log.txt"
import os
import sys
import tempfile

import jax

from jaxfl import RunConfig, run_experiment

backend = jax.default_backend()
if backend == "cpu" and not sys.argv[1]:
    sys.exit(f"preflight: jax {jax.__version__} runs on the CPU ({jax.devices()}), not a GPU: "
             "the GPU figures would be CPU figures")
result = run_experiment(RunConfig(algorithm="fedbuff", dataset="mnist10k", model="cnn", clients=20, concurrency=10,
                                  buffer_size=5, local_steps=2, max_updates=2, progress=False,
                                  output_dir=tempfile.mkdtemp()))
summary = result.summary
assert summary["global_updates"] == 2 and summary["final_accuracy"] is not None, summary
assert os.listdir(os.path.join(result.run_dir, "checkpoints")), "no checkpoint written"
print(f"preflight: jax {jax.__version__} on {backend} ({jax.devices()[0].device_kind}): 2 FedBuff updates, "
      f"accuracy {summary['final_accuracy']:.4f}, {summary['wall_time_s']:.1f} s, checkpoint written")
PYTHON
  local status=${PIPESTATUS[0]}
  # Cut at its limit it found no failure: the backend check comes first and a jaxfl that fails on
  # the device's jax fails within seconds, so a slow compilation (the CNN's programs on a device
  # whose compile times no session has measured, or a loaded CPU at QUICK=1) goes on to the steps.
  if [ "$status" -eq 124 ]; then
    say "=== preflight cut at its ${limit} s limit before it ended (no failure seen): going on"
  elif [ "$status" -ne 0 ]; then
    say "=== preflight failed (exit status $status): stopping before the benchmarks"
    exit 1
  fi
}

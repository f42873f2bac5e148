#!/usr/bin/env bash
# One button for a session that is lent a GPU: from the device tool,
#     run(command="bash benchmarks/gpu_suite.sh", timeout_s=600)
# runs the benchmarks at full size on the device machine (which has jax with CUDA, flax, optax and
# chex but no network: jaxfl is used from the working tree, not installed) and leaves the tables,
# JSON and the device description in $OUT, which come back to this machine. Copy the figures into
# benchmarks/README.md with the device, date and this command. Each step has its own time limit so
# that one slow benchmark cannot eat the whole lease; a step cut short keeps the rows it finished.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
QUICK="${QUICK:-}"  # QUICK=1: a seconds-long smoke run of this script (CPU is fine)

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  python -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

if [ -n "$QUICK" ]; then
  clients=(1 2); steps=2; repeats=1; counts=(600); sample_repeats=3
else
  clients=(1 8 64 256 1024); steps=10; repeats=3; counts=(600 6000 60000); sample_repeats=50
fi

# Vectorised client training vs one client per call (the MNIST CNN, batch 64): the batching limit.
timeout 330 python benchmarks/client_batching.py --clients "${clients[@]}" --steps "$steps" \
  --steps-per-call "$steps" --repeats "$repeats" --json "$OUT/client_batching.json" \
  2>&1 | tee "$OUT/client_batching.txt"
# In-kernel minibatch sampling: O(B) Feistel permutation vs argsort of the client's samples.
timeout 150 python benchmarks/minibatch_sampling.py --max-counts "${counts[@]}" --repeats "$sample_repeats" \
  2>&1 | tee "$OUT/minibatch_sampling.txt"
echo "results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

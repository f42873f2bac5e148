#!/usr/bin/env bash
# One button for the papers' full-size sweeps on a lent GPU, from the device tool:
#     run(command="bash benchmarks/reproduction/gpu_sweep.sh port", timeout_s=600,
#         carry=["benchmarks/out/fashion-mnist"])
# Arguments: PAPER (a file here without .toml: fedcompass, fedcompass_qratio, port, ccfedavg,
# fedasmu), then optionally SIZE (default full) and any `jaxfl sweep` flags that cut the grid
# (e.g. `--seed 0`). The device machine has jax with CUDA, flax, optax and chex but no network:
# jaxfl runs from the working tree.
#
# A full size is more than one 600 s call: the sweep folder lives in the git-ignored
# benchmarks/out/reproduction/, which the warm device machine keeps between calls, and a sweep
# resumes (finished cells are skipped, an interrupted one continues from its checkpoint), so the
# same call again goes on where the last one stopped. Each call stops its sweep at a limit safely
# inside the tool's 600 s, writes the report of what is finished, and copies results and report
# into $OUT, which comes back: copy the tables into benchmarks/reproduction/README.md with the
# device, date and command.
#
# Fashion-MNIST (CC-FedAvg's and FedASMU's data) is not on the device machine: before the first
# call, `mkdir -p benchmarks/out && cp -r /usr/share/datasets/fashion-mnist benchmarks/out/` here
# and carry it as above.
set -uo pipefail
cd "$(dirname "$0")/../.."
paper="${1:?usage: gpu_sweep.sh PAPER [SIZE] [jaxfl sweep flags...]}"
shift
size="${1:-full}"
[ $# -gt 0 ] && shift
file="benchmarks/reproduction/$paper.toml"
if [ ! -f "$file" ]; then
  echo "paper=$paper is not allowed: one of $(cd benchmarks/reproduction && ls *.toml | sed 's/\.toml$//' | tr '\n' ' ')" >&2
  exit 2
fi
OUT="${OUT:-benchmarks/out}"
LIMIT="${LIMIT:-540}"  # seconds of sweeping per call; the report and the copy take the rest
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
sweep_dir="benchmarks/out/reproduction/$paper-$size"
data=()
if [ -e benchmarks/out/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  data=(--data-dir benchmarks/out/fashion-mnist)
fi
if grep -q '^dataset = "mnist10k"' "$file"; then
  data=()  # the embedded data: nothing to read from a folder
fi
mkdir -p "$OUT" "$sweep_dir"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
  python -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  echo "command: jaxfl sweep $file --size $size ${data[*]} $* --out $sweep_dir"
} | tee "$OUT/device.txt"
# SIGINT lets the running cell checkpoint-free stop; the next call restarts or resumes it
timeout -s INT "$LIMIT" python -m jaxfl sweep "$file" --size "$size" ${data[@]+"${data[@]}"} "$@" --out "$sweep_dir"
status=$?
[ "$status" -eq 124 ] && echo "=== the sweep reached this call's ${LIMIT} s: call again to go on"
if [ -f "$sweep_dir/results.csv" ]; then
  python -m jaxfl report "$sweep_dir" --reference fedavg || echo "=== no report yet"
  cp "$sweep_dir/results.csv" "$OUT/" 2>/dev/null
  cp -r "$sweep_dir/report" "$OUT/" 2>/dev/null
fi
exit 0

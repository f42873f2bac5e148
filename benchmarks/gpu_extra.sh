#!/usr/bin/env bash
# The second, short call of a GPU lease, right after gpu_suite.sh while the machine is still warm
# (a fresh start costs a minute or two of the lease's 15 minutes of device time):
#     run(command="bash benchmarks/gpu_extra.sh", timeout_s=275)
# with timeout_s = status's budget_left_s where that is less (its steps' limits add up to 255 s; they
# run in order of value, each cut at its limit, so a short call keeps the first ones). The
# measurements that refine, not decide, issues 16 and 17 — save the first, which may decide
# issue 17's target (a) for convolutional models — in order of value per second (each of the
# first lease's three steps, 2026-12-04, was cut at its limit by XLA:GPU's 7-17 s compilations, so
# these are smaller):
#   1. client_batching --im2col: the MNIST CNN's K vmapped clients with XLA's convolutions (a vmap
#      over kernels makes them grouped convolutions, a known slow path of convolution libraries)
#      against the same clients in the CPU form (every convolution in im2col form, batched matrix
#      products, with the form's max-pool and dense-gradient rewrites: what the engine runs on a CPU),
#      at K = 64, batch 64, 4 steps in calls of 2 (on 2026-12-04 no row finished in 60 s with K = 64
#      and 256 in calls of 10 steps: two unrolled 10-step programs to compile). Above 1,
#      accelerator runs should take the CPU form (today only CPU runs do: jaxfl/experiment.py,
#      cpu_friendly_layers) (65 s);
#   2. determinism: the same FedAvg CNN run (8 clients a call, 2 steps, 3 updates) twice in fresh
#      processes without a compilation cache (about 25 s each on an H200, so likely all that fits),
#      then twice with --xla_gpu_deterministic_ops=true, then
#      (if the step's time allows) with autotuning alone off: whether a GPU run repeats (and
#      resumes) bit for bit, and what the flags cost in step time and save in compile time (80 s);
#   3. sweep_jobs: a sweep of 8 FedBuff MLP cells (mnist10k, 50 updates each) by `jaxfl sweep
#      --jobs 1` and `--jobs 4`: the cells share the GPU, each with a quarter of the memory and of the
#      host's cores; runs the GPU path of --jobs for the first time and measures what it gains (issue
#      16: several cells on one GPU at once, against lockstep below) (70 s);
#   4. sweep_lockstep: whether two sweep cells' in-flight clients trained in one call (2K) beat two
#      calls of K, for the MNIST CNN at K = 16 (issue 16's question for a GPU; the MLP's row came
#      back on 2026-12-04: 1.62x) (40 s).
# client_state.py's host and memmap banks (issue 13) wait for a later lease: `python3
# benchmarks/client_state.py --model mlp --clients 2000 --per-round 200 --rounds 3 --repeats 1` (45 s).
# Tables, JSON (rewritten after every row: a step cut short keeps its finished rows), one log and
# the device's description come back in $OUT. Nothing needs carrying (the data are generated or
# embedded). QUICK=1 OUT=/tmp/x bash benchmarks/gpu_extra.sh is a smoke run (CPU is fine).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # cd to the root, $OUT, device.txt, preflight(), step()

if [ -n "$QUICK" ]; then
  im2col=(--quick --steps 1 --steps-per-call 1 --batch-size 16); determinism=(--quick); jobs=(--quick)
  lockstep=(--quick)
else
  im2col=(--clients 64 --steps 4 --steps-per-call 2 --repeats 2)
  determinism=(--runs 2)
  jobs=(--cells 8 --updates 50 --jobs 1 4)
  lockstep=(--clients 16 --models cnn --repeats 3)
fi

step client_batching_im2col 65 python3 benchmarks/client_batching.py --im2col --no-limit "${im2col[@]}" \
  --json "$OUT/client_batching_im2col.json"
step determinism 80 python3 benchmarks/determinism.py "${determinism[@]}" --json "$OUT/determinism.json"
step sweep_jobs 70 python3 benchmarks/sweep_jobs.py "${jobs[@]}" --json "$OUT/sweep_jobs.json"
step sweep_lockstep 40 python3 benchmarks/sweep_lockstep.py "${lockstep[@]}" --json "$OUT/sweep_lockstep.json"
echo "took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

#!/usr/bin/env bash
# The one button for a session that is lent a GPU: from the device tool,
#     run(command="bash benchmarks/gpu_suite.sh", timeout_s=600, carry=["benchmarks/out/fashion-mnist"])
# runs, in one call, the GPU figures that issue 17 still lacks, and leaves the tables, JSON
# and the device description in $OUT, which come back to this machine. Copy the figures into
# benchmarks/README.md with the device, date and this command.
#
# Sized for the lease as it is now (2026-12): 15 minutes of device time in all, the machine's start
# (a minute or two) and its idle time counted: one full call and a short second one (gpu_extra.sh).
# The first lease (2026-12-04, an H200: benchmarks/README.md, "First GPU figures") measured the
# CNN at K = 1, 8, 64, ResNet-18 at K = 1, 8, FedBuff end to end and the 10^6-client run, and found
# XLA:GPU compiling each training program in 7-17 s: every step but the 10^6-client run was cut at
# its limit. So this call holds what is still missing, in order of value per device second, limits
# adding up to 540 s:
#   0. preflight (45 s; 21.5 s on 2026-12-04): a 2-update jaxfl run on the device; the button stops
#      here where jaxfl fails on the device's jax or jax runs on the CPU (gpu_common.sh);
#   1. issue 17 (a): client_batching, the MNIST CNN at batch 64, K = 256 and 1024 (the rows the
#      target is about beside 64), against one client per call and the one-big-model limit, with
#      FLOPs and MFU, and the same vmapped clients in one rolled step loop (--rolled: one step
#      compiled instead of 10; its compile seconds beside the unrolled chunk's) (170 s);
#   2. issue 17 (b): end_to_end, FedCompass (20 clients, Q 20-100), one client per call, the
#      defaults with a rolled step loop, then the defaults (whose unrolled power-of-two chunks may
#      compile for most of the step: the rolled side comes first so that it is measured) (150 s);
#   3. issue 17 (b): end_to_end, FedBuff cross-device with a rolled step loop beside the defaults
#      (the defaults compiled 4 call shapes for 26.7 s of their 40.3 s on 2026-12-04; since the
#      engine trains ahead only the next arrivals, 2026-12-05, the CPU counts 6 step programs a side,
#      so the defaults may be cut: the rolled side comes first) (90 s);
#   4. issue 17 (a): client_batching with ResNet-18 (CIFAR-shaped) at K = 32 (85 s).
#
# Fashion-MNIST (the FedBuff end-to-end workload's data) is not on the device machine: before the
# call, copy it into the git-ignored benchmarks/out/ here and carry it (31 MB of .gz files):
#     mkdir -p benchmarks/out && cp -r /usr/share/datasets/fashion-mnist benchmarks/out/
# Without it that workload runs on mnist10k and end_to_end_fedbuff.json says so.
#
# Each step has its own time limit, so that one slow benchmark cannot eat the whole call; a step
# cut short keeps the rows it finished, since every script rewrites its JSON after each row.
# QUICK=1 OUT=/tmp/x bash benchmarks/gpu_suite.sh is a smoke run at the --quick sizes (CPU is fine).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # cd to the root, $OUT, device.txt, preflight(), step()

fashion=()
for dir in "${FASHION_MNIST_DIR:-}" benchmarks/out/fashion-mnist /usr/share/datasets/fashion-mnist; do
  if [ -n "$dir" ] && [ -e "$dir/train-images-idx3-ubyte.gz" -o -e "$dir/train-images-idx3-ubyte" ]; then
    fashion=(--fedbuff-data-dir "$dir"); break
  fi
done

if [ -n "$QUICK" ]; then
  cnn=(--quick --rolled); resnet=(--quick --clients 2); compass=(--quick); fedbuff=(--quick)
else
  # the MNIST CNN at batch 64, 10 local steps in one call per client (the largest K last: a step cut
  # short keeps the smaller K); ResNet-18 at K 32, 4 steps in calls of 2 (an unrolled ResNet-18
  # chunk compiles slowly and one call's overhead is nothing beside its steps)
  cnn=(--clients 256 1024 --steps 10 --steps-per-call 10 --repeats 3 --rolled)
  resnet=(--clients 32 --steps 4 --steps-per-call 2 --repeats 3)  # 3: a median of 2 is their mean (K = 1 had one outlier)
  compass=(--repeats 1)
  fedbuff=(--repeats 1 ${fashion[@]+"${fashion[@]}"})
fi

preflight 45
step client_batching 170 python3 benchmarks/client_batching.py "${cnn[@]}" --json "$OUT/client_batching.json"
step end_to_end_fedcompass 150 python3 benchmarks/end_to_end.py --workloads fedcompass \
  --sides one_per_call rolled defaults "${compass[@]}" --json "$OUT/end_to_end_fedcompass.json"
step end_to_end_fedbuff 90 python3 benchmarks/end_to_end.py --workloads fedbuff --sides rolled defaults \
  "${fedbuff[@]}" --json "$OUT/end_to_end_fedbuff.json"
step client_batching_resnet18 85 python3 benchmarks/client_batching.py --model resnet18 "${resnet[@]}" \
  --json "$OUT/client_batching_resnet18.json"
echo "suite took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

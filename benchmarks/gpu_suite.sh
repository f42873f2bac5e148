#!/usr/bin/env bash
# The one button for a session that is lent a GPU: from the device tool,
#     run(command="bash benchmarks/gpu_suite.sh", timeout_s=600, carry=["benchmarks/out/fashion-mnist"])
# runs, in one call, the GPU figures that issues 17 and 13 still lack, and leaves the tables, JSON
# and the device description in $OUT, which come back to this machine. Copy the figures into
# benchmarks/README.md with the device, date and this command.
#
# Sized for the lease as it is now (2026-11): 15 minutes of device time in all, the machine's start
# (a minute or two) and its idle time counted. That is one full call and a short second one
# (gpu_extra.sh), not the three 10-minute calls planned before; so this call holds the must-haves of
# both issues, in order of value per device second, their limits adding up to 540 s:
#   0. preflight (45 s): a 2-update jaxfl run on the device; the button stops here where jaxfl
#      fails on the device's jax or jax runs on the CPU (gpu_common.sh);
#   1. issue 17 (a): client_batching, the MNIST CNN at batch 64, K = 1, 8, 64, 256, 1024 against
#      one client per call and the one-big-model limit, with FLOPs and MFU (160 s);
#   2. issue 17 (b): end_to_end, FedBuff cross-device and FedCompass, engine defaults against one
#      client per call (140 s);
#   3. issue 13: the 10^6-client FedBuff training run (million_clients.py, logreg, 1,000 in flight,
#      K = 10), its federation built on every core of the device machine's host (110 s);
#   4. issue 17 (a): client_batching with ResNet-18 (CIFAR-shaped) at K = 1, 8, 32 (85 s).
#
# Fashion-MNIST (the FedBuff end-to-end workload's data) is not on the device machine: before the
# call, copy it into the git-ignored benchmarks/out/ here and carry it (31 MB of .gz files):
#     mkdir -p benchmarks/out && cp -r /usr/share/datasets/fashion-mnist benchmarks/out/
# Without it that workload runs on mnist10k and end_to_end.json says so.
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
  cnn=(--quick); resnet=(--quick --clients 2); e2e=(--quick); million=(--quick)
else
  # the MNIST CNN at batch 64, 10 local steps in one call per client, K up to 1024 (the largest
  # last: a step cut short keeps the smaller K); ResNet-18 at K 1 8 32, 4 steps in calls of 2 (an
  # unrolled ResNet-18 chunk compiles slowly and one call's overhead is nothing beside its steps)
  cnn=(--clients 1 8 64 256 1024 --steps 10 --steps-per-call 10 --repeats 3)
  resnet=(--clients 1 8 32 --steps 4 --steps-per-call 2 --repeats 2)
  # both workloads, engine defaults vs one client per call; a second round of both sides starts
  # only if it should end inside the step's limit
  e2e=(--repeats 2 --time-budget 125 ${fashion[@]+"${fashion[@]}"})
  # 10^6 clients of FedProx's synthetic_iid: "+parallel" draws the samples on every core (the host
  # has 16; the plain name draws on one, ~60 s at 10^6 clients), then the run stops at its first
  # evaluation past --time-budget, so that it ends with its summary
  million=(--clients 1000000 --dataset synthetic:iid+parallel --concurrency 1000 --buffer-size 10
           --updates 3000 --eval-every 250 --models logreg --time-budget 90)
fi

preflight 45
step client_batching 160 python3 benchmarks/client_batching.py "${cnn[@]}" --json "$OUT/client_batching.json"
step end_to_end 140 python3 benchmarks/end_to_end.py "${e2e[@]}" --json "$OUT/end_to_end.json"
step million_logreg 110 python3 benchmarks/million_clients.py "${million[@]}" --json "$OUT/million_logreg.json"
step client_batching_resnet18 85 python3 benchmarks/client_batching.py --model resnet18 "${resnet[@]}" \
  --json "$OUT/client_batching_resnet18.json"
echo "suite took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

#!/usr/bin/env bash
# One button for a session that is lent a GPU: from the device tool,
#     run(command="bash benchmarks/gpu_suite.sh", timeout_s=600, carry=["benchmarks/out/fashion-mnist"])
# runs issue 17's GPU benchmarks on the device machine (which has jax with CUDA, flax, optax and
# chex but no network: jaxfl is used from the working tree, not installed) and leaves the tables,
# JSON and the device description in $OUT, which come back to this machine. Copy the figures into
# benchmarks/README.md with the device, date and this command.
#
# Fashion-MNIST (the FedBuff end-to-end workload's data) is not on the device machine: before the
# call, copy it into the git-ignored benchmarks/out/ here and carry it (31 MB of .gz files):
#     mkdir -p benchmarks/out && cp -r /usr/share/datasets/fashion-mnist benchmarks/out/
# Without it that workload runs on mnist10k and end_to_end.json says so.
#
# Each step has its own time limit, so that one slow benchmark cannot eat the whole lease (the
# steps' limits add up to 550 s, inside the tool's 600 s); a step cut short keeps the rows it
# finished, since every script rewrites its JSON after each row.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # cd to the root, $OUT, device.txt, step()

fashion=()
for dir in "${FASHION_MNIST_DIR:-}" benchmarks/out/fashion-mnist /usr/share/datasets/fashion-mnist; do
  if [ -n "$dir" ] && [ -e "$dir/train-images-idx3-ubyte.gz" -o -e "$dir/train-images-idx3-ubyte" ]; then
    fashion=(--fedbuff-data-dir "$dir"); break
  fi
done

if [ -n "$QUICK" ]; then
  cnn=(--quick); resnet=(--quick --clients 2); e2e=(--quick)
  counts=(600); sample_repeats=3
else
  # (a) the MNIST CNN at batch 64, 10 local steps in one call per client, K up to 1024 (the largest
  # last: a step cut short keeps the smaller K); ResNet-18 at K 1 8 32, 4 steps in calls of 2 (an
  # unrolled ResNet-18 chunk compiles slowly and one call's overhead is nothing beside its steps).
  cnn=(--clients 1 8 64 256 1024 --steps 10 --steps-per-call 10 --repeats 3)
  resnet=(--clients 1 8 32 --steps 4 --steps-per-call 2 --repeats 2)
  # (b) both workloads, engine defaults vs one client per call, two alternating rounds (a second
  # round starts only if it should end inside the step's limit)
  e2e=(--repeats 2 --time-budget 150 ${fashion[@]+"${fashion[@]}"})
  counts=(600 6000 60000); sample_repeats=50
fi

# (a) Vectorised client training vs one client per call vs the one-big-model limit, with MFU.
step client_batching 200 python benchmarks/client_batching.py "${cnn[@]}" --json "$OUT/client_batching.json"
step client_batching_resnet18 120 python benchmarks/client_batching.py --model resnet18 "${resnet[@]}" \
  --json "$OUT/client_batching_resnet18.json"
# (b) End to end: run_experiment with engine defaults vs one client per call (FedBuff, FedCompass).
step end_to_end 170 python benchmarks/end_to_end.py "${e2e[@]}" --json "$OUT/end_to_end.json"
# In-kernel minibatch sampling: O(B) Feistel permutation vs argsort of the client's samples.
step minibatch_sampling 60 python benchmarks/minibatch_sampling.py --max-counts "${counts[@]}" \
  --repeats "$sample_repeats"
echo "suite took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

#!/usr/bin/env bash
# The second, short call of a GPU lease, right after gpu_suite.sh while the machine is still warm
# (a fresh start costs a minute or two of the lease's 15 minutes of device time):
#     run(command="bash benchmarks/gpu_extra.sh", timeout_s=170)
# only where status's budget_left_s still holds the call (its steps' limits add up to 150 s).
# The measurements that refine, not decide, issues 13, 16 and 17, in order of value per second:
#   1. sweep_lockstep: whether two sweep cells' in-flight clients trained in one call (2K) beat two
#      calls of K, for the MLP and the MNIST CNN at K = 16 and 64 (issue 16's question for a GPU; on
#      the CPU it did not pay) (50 s);
#   2. minibatch_sampling: the in-kernel O(B) Feistel permutation against an argsort of the
#      client's samples, up to 60,000 samples a client (30 s);
#   3. client_state: CC-FedAvg's per-client bank on the device, in host RAM and in a memmap, at a
#      size where the host-to-device row copies matter (the MNIST CNN, 2,000 clients, 200 a round:
#      a 4.4 GB bank, 440 MB of rows each way a round) (70 s).
# Tables, JSON (rewritten after every row: a step cut short keeps its finished rows), one log and
# the device's description come back in $OUT. Nothing needs carrying (the data are generated or
# embedded). QUICK=1 OUT=/tmp/x bash benchmarks/gpu_extra.sh is a smoke run (CPU is fine).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # cd to the root, $OUT, device.txt, preflight(), step()

if [ -n "$QUICK" ]; then
  lockstep=(--quick); counts=(600); sample_repeats=3; state=(--quick)
else
  lockstep=(--clients 16 64 --repeats 3)
  counts=(600 6000 60000); sample_repeats=20
  state=(--model cnn --clients 2000 --per-round 200 --rounds 5 --repeats 1)
fi

step sweep_lockstep 50 python3 benchmarks/sweep_lockstep.py "${lockstep[@]}" --json "$OUT/sweep_lockstep.json"
step minibatch_sampling 30 python3 benchmarks/minibatch_sampling.py --max-counts "${counts[@]}" \
  --repeats "$sample_repeats"
step client_state 70 python3 benchmarks/client_state.py "${state[@]}" --json "$OUT/client_state.json"
echo "took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

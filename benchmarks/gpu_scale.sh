#!/usr/bin/env bash
# Issue 13's button for a session that is lent a GPU: from the device tool,
#     run(command="bash benchmarks/gpu_scale.sh", timeout_s=600)
# runs, each step under its own time limit (550 s in all, inside the tool's 600 s), in order of
# value per device minute:
#   1. million_logreg: the 10^6-client FedBuff training run (FedProx's synthetic_iid federation,
#      1,000 in flight, K = 10, logreg, 5 SGD steps of batch 10), up to 3,000 aggregations;
#   2. client_state: CC-FedAvg's per-client bank on the device, in host RAM and in a memmap, at a
#      size where the host-to-device row copies matter (the MNIST CNN, 2,000 clients, 200 a round:
#      a 4.4 GB bank, 440 MB of rows each way a round);
#   3. million_mlp: the same 10^6-client run with the MLP (54,410 parameters), up to 3,000 aggregations;
#   4. sweep_lockstep: whether two sweep cells' in-flight clients trained in one call (2K) beat two
#      calls of K, for the MLP and the MNIST CNN at K = 16 and 64 (issue 16's question for a GPU).
# Tables, JSON (rewritten after every run: a step cut short keeps its finished runs) and the
# device's description (device.txt) come back in $OUT. Copy the figures into benchmarks/README.md
# ("On a lent GPU") with the device, date and this command.
#
# Nothing needs carrying: the data are generated (synthetic) or embedded (mnist10k), and jaxfl runs
# from the working tree with PYTHONPATH. Its imports beyond jax, flax, optax, chex and numpy are lazy
# and these steps reach none of them except orbax-checkpoint (checkpoints; flax depends on it);
# pyarrow would be needed only past 200,000 event-log rows (~9,500 aggregations here). Should the
# device lack a package (`python3 -m pip show NAME` there), carry wheels as
# /work/.library/device/README.md says (.whl, installed with --target /tmp/site, PYTHONPATH).
#
# QUICK=1 bash benchmarks/gpu_scale.sh is a smoke run at the scripts' --quick sizes (CPU is fine).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"  # cd to the root, $OUT, device.txt, step()

if [ -n "$QUICK" ]; then
  million=(--quick); state=(--quick); lockstep=(--quick)
else
  # Budgets from the 2-core CPU's figures (benchmarks/README.md): building the federation took
  # ~60 s there (one core: the normal draws), and the run itself stops at its first evaluation
  # past --time-budget, so each step ends with its summary; the step limits leave 20-25 s over.
  million=(--clients 1000000 --concurrency 1000 --buffer-size 10 --updates 3000 --eval-every 250)
  state=(--model cnn --clients 2000 --per-round 200 --rounds 10 --repeats 2)
  # would a sweep gain from training two cells' in-flight clients in one call? (2K against K + K;
  # on the CPU it did not: benchmarks/README.md); last, so a cut keeps the rows it finished
  lockstep=(--clients 16 64 --repeats 3)
fi

budget() {  # budget LIMIT_S: the run's own budget inside a step's limit (QUICK: none)
  [ -n "$QUICK" ] || echo "--time-budget $(( $1 - 25 ))"
}

step million_logreg 190 python benchmarks/million_clients.py "${million[@]}" --models logreg $(budget 190) \
  --json "$OUT/million_logreg.json"
step client_state 145 python benchmarks/client_state.py "${state[@]}" --json "$OUT/client_state.json"
step million_mlp 155 python benchmarks/million_clients.py "${million[@]}" --models mlp $(budget 155) \
  --json "$OUT/million_mlp.json"
step sweep_lockstep 60 python benchmarks/sweep_lockstep.py "${lockstep[@]}" --json "$OUT/sweep_lockstep.json"
echo "suite took $((SECONDS - started)) s; results in $OUT: $(ls "$OUT" | tr '\n' ' ')"

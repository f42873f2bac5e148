#!/usr/bin/env bash
# FedCompass's cpu size, seed 2 under exponential speeds: the 32 cells that take a day or more of
# the 2-core development CPU (README, "FedCompass cpu size"), run a cell at a time across sessions.
#
#     bash benchmarks/reproduction/seed2_exp.sh STREAM STREAMS     # e.g. 0 2 and 1 2, side by side
#
# Each cell is a one-cell `jaxfl sweep` in the git-ignored benchmarks/out/sweeps/fedcompass-cpu-
# seed2-exp/CELL (run again in the same session it resumes from its checkpoint); a finished cell's
# table is copied to results/fedcompass-cpu-seed2-exp/CELL.csv, which is committed, and a cell with
# a table there is skipped. So a development machine that is replaced between sessions loses at
# most the cells in progress. STREAM of STREAMS takes every STREAMS-th cell of the list, cheapest
# first (the synchronous methods wait for the slow clients, so the one fast client costs them
# nothing). `jaxfl report benchmarks/reproduction/results/fedcompass-cpu-seed2-exp/*.csv ...` takes
# the tables together.
set -uo pipefail
cd "$(dirname "$0")/../.."
stream="${1:-0}"
streams="${2:-1}"
tables=benchmarks/reproduction/results/fedcompass-cpu-seed2-exp
sweeps=benchmarks/out/sweeps/fedcompass-cpu-seed2-exp
mkdir -p "$tables" "$sweeps"
index=0
for algorithm in fedavg fedavgm fedbuff fedat fedcompass_n fedcompass fedcompass_m fedasync; do
  for clients in 5 10; do
    for partition in class dual_dirichlet; do
      cell="$algorithm-c$clients-$partition"
      mine=$((index % streams == stream))
      index=$((index + 1))
      [ "$mine" = 1 ] || continue
      [ -f "$tables/$cell.csv" ] && continue
      echo "$(date -u +%FT%TZ) start $cell"
      jaxfl sweep benchmarks/reproduction/fedcompass.toml --size cpu --seed 2 --heterogeneity exp \
          --algorithm "$algorithm" --clients "$clients" --partition "$partition" \
          --no-progress --out "$sweeps/$cell"
      status=$?  # read before the date below, whose command substitution sets $? again
      if [ "$status" = 0 ]; then
        cp "$sweeps/$cell/results.csv" "$tables/$cell.csv"
        echo "$(date -u +%FT%TZ) done $cell"
      else
        echo "$(date -u +%FT%TZ) stopped $cell (exit $status)"
        exit 1
      fi
    done
  done
done

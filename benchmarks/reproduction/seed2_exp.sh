#!/usr/bin/env bash
# Seed 2 under exponential speeds at the cpu size, the cells that take a day or more of the 2-core
# development CPU, run a cell at a time across sessions:
# - fedcompass (default): FedCompass's 32 (fedcompass.toml; README, "FedCompass cpu size");
# - qratio: the Q_min/Q_max ablation's 6 (fedcompass_qratio.toml; README, "FedCompass Q_min/Q_max
#   ablation"), about two hours each; its Q_min = 40 is the fedcompass grid's fedcompass-c10-class cell.
#
#     bash benchmarks/reproduction/seed2_exp.sh STREAM STREAMS [GRID]     # e.g. 0 2 and 1 2, side by side
#
# Each cell is a one-cell `jaxfl sweep` in the git-ignored benchmarks/out/sweeps/NAME/CELL (run again in
# the same session it resumes from its checkpoint); a finished cell's table is copied to
# results/NAME/CELL.csv, which is committed, and a cell with a table there is skipped. So a development
# machine that is replaced between sessions loses at most the cells in progress. STREAM of STREAMS takes
# every STREAMS-th cell of the list, cheapest first where known (the synchronous methods wait for the
# slow clients, so the one fast client costs them nothing). `jaxfl report
# benchmarks/reproduction/results/NAME/*.csv ...` takes the tables together.
set -uo pipefail
cd "$(dirname "$0")/../.."
stream="${1:-0}"
streams="${2:-1}"
grid="${3:-fedcompass}"
column=""  # a grid's setting that its one-cell sweeps take as a base setting, added to each table as a column
case "$grid" in
  fedcompass) name=fedcompass-cpu-seed2-exp; file=benchmarks/reproduction/fedcompass.toml
    cells=()
    for algorithm in fedavg fedavgm fedbuff fedat fedcompass_n fedcompass fedcompass_m fedasync; do
      for clients in 5 10; do
        for partition in class dual_dirichlet; do
          cells+=("$algorithm-c$clients-$partition --algorithm $algorithm --clients $clients --partition $partition")
        done
      done
    done ;;
  qratio) name=fedcompass-qratio-cpu-seed2-exp; file=benchmarks/reproduction/fedcompass_qratio.toml
    column=compass.q_min  # (the ablation's other tables have it, which the report groups by)
    cells=()
    for q_min in 10 20 80 120 160 200; do
      cells+=("q_min-$q_min --compass.q-min $q_min")
    done ;;
  *) echo "seed2_exp.sh: GRID $grid is not allowed: fedcompass or qratio" >&2; exit 2 ;;
esac

add_column() {  # TABLE NAME VALUE: the column after "seed", where the ablation's other tables have it
  python3 - "$@" <<'PY'
import csv
import sys

path, name, value = sys.argv[1:]
with open(path, newline="") as handle:
    rows = list(csv.reader(handle))
at = rows[0].index("seed") + 1
for number, row in enumerate(rows):
    row.insert(at, name if number == 0 else value)
with open(path, "w", newline="") as handle:
    csv.writer(handle, lineterminator="\n").writerows(rows)
PY
}

tables=benchmarks/reproduction/results/$name
sweeps=benchmarks/out/sweeps/$name
mkdir -p "$tables" "$sweeps"
index=0
for entry in "${cells[@]}"; do
  read -r cell flags <<< "$entry"
  mine=$((index % streams == stream))
  index=$((index + 1))
  [ "$mine" = 1 ] || continue
  [ -f "$tables/$cell.csv" ] && continue
  echo "$(date -u +%FT%TZ) start $cell"
  # shellcheck disable=SC2086  # the cell's flags, split into words
  jaxfl sweep "$file" --size cpu --seed 2 --heterogeneity exp $flags --no-progress --out "$sweeps/$cell"
  status=$?  # read before the date below, whose command substitution sets $? again
  if [ "$status" = 0 ]; then
    cp "$sweeps/$cell/results.csv" "$tables/$cell.csv.tmp"
    if [ -n "$column" ]; then add_column "$tables/$cell.csv.tmp" "$column" "${flags##* }" || exit 1; fi
    mv "$tables/$cell.csv.tmp" "$tables/$cell.csv"
    echo "$(date -u +%FT%TZ) done $cell"
  else
    echo "$(date -u +%FT%TZ) stopped $cell (exit $status)"
    exit 1
  fi
done

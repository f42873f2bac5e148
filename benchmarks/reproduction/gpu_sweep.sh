#!/usr/bin/env bash
# One button for the papers' full-size sweeps on a lent GPU, from the device tool:
#     run(command="bash benchmarks/reproduction/gpu_sweep.sh fedasmu", timeout_s=600,
#         carry=["benchmarks/out/fashion-mnist"])
# Arguments: PAPER (a file here without .toml: fedcompass, fedcompass_qratio, port, ccfedavg,
# fedasmu), then optionally SIZE (default full) and any `jaxfl sweep` flags that cut the grid
# (e.g. `--seed 0`). The device machine has jax with CUDA, flax, optax and chex but no network:
# jaxfl runs from the working tree.
#
# A full size is more than one 600 s call. A sweep resumes (finished cells are skipped, an
# interrupted one continues from its checkpoint), so the same call again goes on where the last
# one stopped. The sweep folder lives in the git-ignored benchmarks/out/reproduction/; a warm
# device machine keeps it between calls, but one that went idle (30 s) comes back bare. So each
# call also returns the whole folder as $OUT/PAPER-SIZE.tar.gz (run directories without the
# checkpoints of finished cells; without any checkpoint if it would pass the tool's 16 MiB a
# file), and a call that finds no folder but a carried archive starts from it:
#     mkdir -p benchmarks/out/carry && cp FILES_AT/fedasmu-full.tar.gz benchmarks/out/carry/
#     run(command="bash benchmarks/reproduction/gpu_sweep.sh fedasmu full --seed 0", timeout_s=600,
#         carry=["benchmarks/out/fashion-mnist", "benchmarks/out/carry"])
# Each call stops its sweep at a limit safely inside the tool's 600 s and writes the report of
# what is finished; results.csv and report.md come back beside the archive (the figures are in
# the archive's report/, or `jaxfl report` on the unpacked folder here). Copy the tables into
# benchmarks/reproduction/README.md with the device, date and command.
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
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # absolute: the archive is written from the sweep's parent
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
archive="$paper-$size.tar.gz"
if [ ! -d "$sweep_dir" ] && [ -f "benchmarks/out/carry/$archive" ]; then
  mkdir -p "$(dirname "$sweep_dir")"
  tar -xzf "benchmarks/out/carry/$archive" -C "$(dirname "$sweep_dir")" \
    && echo "=== went on from the carried benchmarks/out/carry/$archive"
fi
mkdir -p "$OUT" "$sweep_dir"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
  python3 -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  python3 -c "import importlib.util as u; print('optional packages:', {m: bool(u.find_spec(m)) for m in ('tqdm', 'pyarrow', 'matplotlib')})"
  echo "command: jaxfl sweep $file --size $size ${data[*]} --no-progress $* --out $sweep_dir"
} | tee "$OUT/device.txt"
# SIGINT lets the running cell checkpoint-free stop; the next call restarts or resumes it. Python
# acts on it only between bytecodes, so a long XLA compilation or device call holds it off: 15 s
# later SIGKILL, which costs the running cell's steps since its last checkpoint, never the call's
# report and archive below.
# --no-progress: one line per finished cell in the log instead of a bar (and no need of tqdm); without
# pyarrow the sweep writes results.csv alone, and without matplotlib the report has no figures
timeout -s INT -k 15 "$LIMIT" python3 -m jaxfl sweep "$file" --size "$size" ${data[@]+"${data[@]}"} --no-progress "$@" \
  --out "$sweep_dir"
status=$?
case "$status" in
  124) echo "=== the sweep reached this call's ${LIMIT} s: call again to go on" ;;
  137) echo "=== the sweep reached this call's ${LIMIT} s and did not stop within 15 s of SIGINT, so it was killed: call again to go on" ;;
esac
if [ -f "$sweep_dir/results.csv" ]; then
  figures=$(python3 -c "import importlib.util as u; print('' if u.find_spec('matplotlib') else '--no-figures')")
  python3 -m jaxfl report "$sweep_dir" --reference fedavg $figures || echo "=== no report yet"
  cp "$sweep_dir/results.csv" "$OUT/" 2>/dev/null
  cp "$sweep_dir/report/report.md" "$OUT/" 2>/dev/null
fi
# the folder for the next call (see the top): a finished cell needs no checkpoint to be skipped,
# an interrupted one only its newest
python3 - "$sweep_dir" "$OUT/$archive" <<'PYTHON'
import os, sys, tarfile
from jaxfl import checkpoint

sweep_dir, archive = sys.argv[1], sys.argv[2]
runs = os.path.join(sweep_dir, "runs")
keep = set()
for name in os.listdir(runs) if os.path.isdir(runs) else []:
    run_dir = os.path.join(runs, name)
    newest = None if os.path.isfile(os.path.join(run_dir, "summary.json")) else checkpoint.latest(run_dir)
    if newest is not None:
        keep.update({os.path.abspath(newest), os.path.abspath(os.path.join(run_dir, "checkpoints", "latest"))})

def archive_folder(with_checkpoints):
    def only_needed(member):
        parts = member.name.split("/")
        if "checkpoints" in parts[:-1] or parts[-1] == "checkpoints":
            where = parts.index("checkpoints")
            if where + 1 >= len(parts):
                return member if with_checkpoints else None
            path = os.path.abspath(os.path.join(os.path.dirname(sweep_dir), *parts[:where + 2]))
            return member if with_checkpoints and path in keep else None
        return member
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(sweep_dir, arcname=os.path.basename(sweep_dir), filter=only_needed)

archive_folder(with_checkpoints=True)
if os.path.getsize(archive) > 16 * 1024 * 1024:
    archive_folder(with_checkpoints=False)
    print(f"=== {os.path.basename(archive)} holds no checkpoint (over 16 MiB with them): an interrupted cell restarts")
PYTHON
echo "=== returned: $(ls "$OUT" | tr '\n' ' ')"
exit 0

# Sourced by the GPU buttons (gpu_suite.sh, gpu_scale.sh): the shared set-up — the repository root
# as the working directory and on PYTHONPATH, $OUT, the device's description in $OUT/device.txt —
# and step(), which runs one benchmark under its own time limit so that one slow step cannot eat
# the device tool's whole 600 s call.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
QUICK="${QUICK:-}"  # QUICK=1: a smoke run at the scripts' --quick sizes (CPU is fine)
started=$SECONDS

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  python -c "import jax; print('jax', jax.__version__, jax.default_backend(), jax.devices())"
  python -c "import importlib.util as u; print('packages:', {m: bool(u.find_spec(m)) for m in ('orbax.checkpoint', 'pyarrow', 'tqdm')})"
  nproc; free -g | head -2
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

step() {  # step NAME LIMIT_S COMMAND...: run one benchmark under its own limit, log to $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit} s, suite at $((SECONDS - started)) s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  local status=${PIPESTATUS[0]}
  [ "$status" -eq 124 ] && echo "=== $name: cut at its ${limit} s limit (what it finished is in its JSON)"
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] && echo "=== $name: exit status $status"
  return 0
}

# DAS reproducibility across numpy/BLAS builds: the same DAS-placed simulations here and
# on another machine; writes one JSON of mean JCTs per run. Usage: das_repro.sh OUTDIR [PY]
set -e
res=$1; py=${2:-python3}; out=$(mktemp -d)
mkdir -p "$res"
$py -c "import numpy, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__); numpy.show_config()" > "$res/env.txt" 2>&1 || true
run() {  # name trace seed policy
  $py -m rlsched.cli sim run --trace "$2" --seed "$3" --policy "$4" --out "$out/$1" --quiet > "$out/$1.log" 2>&1 &
}
run a synthetic:medium,jobs=300,load=1.0 20000 drf/das/fs+backfill
run b synthetic:medium,jobs=300,load=1.5 20001 tiresias/das/fs+backfill
run c synthetic:medium,jobs=1000,load=1.0 20000 drf/das/fs+backfill
run d synthetic:medium,jobs=1000,load=1.5 20000 goodput-learned/das
run e synthetic:medium,jobs=1000,load=1.5 20000 goodput-rlpto/das
run f synthetic:medium,jobs=1000,load=2.0 20002 drf/das/fs+nobackfill
wait
$py - "$out" "$res" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1]); res = {}
for d in sorted(p for p in out.iterdir() if p.is_dir()):
    m = json.loads((d / "metrics.json").read_text())
    res[d.name] = {k: m.get(k) for k in ("jct_mean", "jct_p95", "makespan", "gpu_util_mean", "jobs_completed") if k in m}
(pathlib.Path(sys.argv[2]) / "jct.json").write_text(json.dumps(res, indent=1, sort_keys=True))
print(json.dumps(res, sort_keys=True))
PY

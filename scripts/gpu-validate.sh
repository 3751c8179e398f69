#!/usr/bin/env bash
# cudaleak on a real GPU: PyTorch, CuPy, JAX, nvcc programs, checked.
# Results feed docs/gpu-validation.md.
#
#   scripts/gpu-validate.sh ARTIFACTS OUT [SECTION...]
#
# ARTIFACTS holds libcudaleak.so and cudaleak, built elsewhere with
# `cargo build --release` (the GPU machine has no cargo); OUT receives
# summary.txt (everything printed, appended), checks.txt (this run's CHECK
# lines) and reports.tar.gz (reports, ground truths, compute-sanitizer's
# output). Needs nvidia-smi, nvcc, compute-sanitizer, gcc and python3 with
# torch, cupy and jax installed.
#
# Every check compares what cudaleak reported with a ground truth that does
# not come from cudaleak (the planted program's own account of its leaks
# and the lines marked in its source, compute-sanitizer --leak-check full,
# PyTorch's counters and its OutOfMemoryError message) and prints one line:
#
#   CHECK <name>: PASS|FAIL <figure> (tolerance <tolerance>)
#
# A step (a program run) is a check too: FAIL when it exits non-zero or
# overruns its time limit. The checkers are gpu/check_report.py (nvcc and
# python sections) and the `verify` modes of gpu/torch_checks.py and
# gpu/cupy_jax_checks.py; they run outside the preload. The run ends with
#
#   gpu-validate: N checks, M failed
#   gpu-validate: rerun: scripts/gpu-validate.sh ARTIFACTS OUT SECTION...  (when M > 0)
#
# and exits 0 when every check passed, 1 when one failed, 2 on bad usage.
#
# Sections, and their budgets on one H100/H200 (typical time in brackets):
#   default:  env 25 s [15]  sanity 10 s [3]  nvcc 60 s [25]  python 25 s [8]
#             torch 130 s [70]  oom 95 s [55]  frameworks 70 s [35]
#             libraries 50 s [25]  procaddr 15 s [5]  untouched 40 s [25]
#             ranks 60 s [45]  live 40 s [20]  graphs 40 s [25]
#                                                       = 660 s, about 6 min typical
#   extras (not in the default; measurements, not checks, except torch-dump):
#             torch-dump 40 s  overhead 150 s  bench (what is left)
# Whatever runs, one deadline bounds it: steps start only before
# GPU_VALIDATE_BUDGET_S (default 450 s) and each step's limit is cut to it;
# checkers and report printing get 20 s more (and at most 30 s each), so
# the whole run ends within 8 minutes (480 s). A step
# the deadline stops is a FAIL (`not run` or `timed out`), and its section
# is in the rerun list.
set -uo pipefail
if [ $# -lt 2 ]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d' >&2
    exit 2
fi
ART=$(realpath "$1")
OUT=$(realpath -m "$2")
shift 2
SECTIONS=${*:-env sanity nvcc python torch oom frameworks libraries procaddr untouched ranks live graphs}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cudaleak-gpu.XXXXXX")
CLI="$ART/cudaleak"
BUDGET=${GPU_VALIDATE_BUDGET_S:-450}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
CHECKER_GRACE=20
export CUDALEAK_LIBRARY="$ART/libcudaleak.so"
export CUDALEAK_CLI="$CLI"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
CHECKS="$OUT/checks.txt"
: >"$CHECKS"
export GPU_CHECK_LOG="$CHECKS"
exec > >(tee -a "$OUT/summary.txt") 2>&1
TEE_PID=$!
SECTION=setup

say() { printf '\n=== %s\n' "$*"; }

# record NAME PASS|FAIL FIGURE TOLERANCE: one CHECK line, printed and logged
# (the format of gpu/check_report.py's check()).
record() {
    local line="CHECK $1: $2 $3 (tolerance $4)"
    echo "$line"
    echo "$line" >>"$CHECKS"
}

# failures: FAIL lines so far (the word after the first ": " of a line).
failures() { awk -F': ' '/^CHECK /{split($2, a, " "); if (a[1] == "FAIL") n++} END{print n+0}' "$CHECKS"; }

# left [GRACE]: seconds until the deadline (plus GRACE).
left() { echo $((DEADLINE + ${1:-0} - $(date +%s))); }

# step LABEL SECONDS CMD...: runs CMD with a time limit (cut to the
# deadline), records a check (PASS: exit 0 within the limit), prints its
# wall time, and returns CMD's status (124 when timed out, 125 when the
# deadline had passed and it did not run).
step() {
    local label=$1 limit=$2
    shift 2
    local remaining t0 rc ms status note="" cmd="$*"
    remaining=$(left)
    if ((remaining < 5)); then
        record "$SECTION $label" FAIL "not run, the ${BUDGET} s budget is spent" "exit 0 within $limit s"
        return 125
    fi
    ((limit > remaining)) && limit=$remaining
    cmd=${cmd//$'\n'/ }
    echo "--- $label: ${cmd:0:240}"
    t0=$(date +%s%N)
    timeout -k 5 "$limit" "$@"
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    status=FAIL
    ((rc == 0)) && status=PASS
    ((rc == 124 || rc == 137)) && note=", timed out"
    record "$SECTION $label" "$status" "exit $rc in $ms ms$note" "exit 0 within $limit s"
    return "$rc"
}

# checks LABEL CMD...: a checker printing its own CHECK lines; it exits 0
# (all passed) or 1 (one failed); anything else (a crash, its time limit)
# is a FAIL of its own.
checks() {
    local label=$1
    shift
    local remaining limit=60 rc
    remaining=$(left "$CHECKER_GRACE")
    if ((remaining < 3)); then
        record "$SECTION $label checks" FAIL "not run, the ${BUDGET} s budget is spent" "the checker runs"
        return
    fi
    ((limit > remaining)) && limit=$remaining
    timeout -k 5 "$limit" "$@"
    rc=$?
    if ((rc > 1)); then
        record "$SECTION $label checks" FAIL "checker exit $rc" "exit 0 or 1 after its CHECK lines"
    fi
}

# cap SECONDS: SECONDS, or less when the deadline (plus the checkers'
# grace) is nearer; at least 1.
cap() {
    local n
    n=$(left "$CHECKER_GRACE")
    ((n > $1)) && n=$1
    ((n < 1)) && n=1
    echo "$n"
}

# reports ARGS...: a report as text, for the record (not a check).
reports() { timeout "$(cap 30)" "$CLI" report "$@" 2>&1 | head -"${LINES_MAX:-120}"; }

# done_: the summary and the exit status.
done_() {
    find "$WORK" \( -name 'cudaleak.*.json' -size -8M \) -o -name '*.truth.json' -o -name planted.txt \
        -o -name sanitizer.txt -o -name '*.planted.txt' -o -name '*.run.txt' | tar czf "$OUT/reports.tar.gz" -T - 2>/dev/null
    local total failed
    total=$(grep -c '^CHECK ' "$CHECKS")
    failed=$(failures)
    echo
    if ((failed > 0)); then
        echo "gpu-validate: failed:"
        awk -F': ' '/^CHECK /{split($2, a, " "); if (a[1] == "FAIL") print "  " $0}' "$CHECKS"
    fi
    echo "gpu-validate: $((($(date +%s) - START))) s; $OUT"
    echo "gpu-validate: $total checks, $failed failed"
    if ((failed > 0)); then
        echo "gpu-validate: rerun: scripts/gpu-validate.sh $ART $OUT$FAILED_SECTIONS"
    fi
    # Let tee write the last lines before the exit status is seen.
    exec 1>&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    ((failed == 0)) && exit 0
    exit 1
}

FAILED_SECTIONS=""
for f in "$CLI" "$ART/libcudaleak.so"; do
    [ -e "$f" ] || record "setup artifacts" FAIL "$f missing" "cudaleak and libcudaleak.so in ARTIFACTS"
done
if (($(failures) > 0)); then
    FAILED_SECTIONS=" $SECTIONS"
    done_
fi

TORCH=$ROOT/gpu/torch_checks.py
FW=$ROOT/gpu/cupy_jax_checks.py
CHECKER=$ROOT/gpu/check_report.py

for s in $SECTIONS; do
SECTION=$s
before=$(failures)
case $s in
env)
    # 25 s: versions; a missing tool or module is a FAIL here, not later.
    say "environment ($(date -u +%Y-%m-%dT%H:%MZ))"
    step nvidia-smi 15 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    step nvcc 10 nvcc --version
    step compute-sanitizer 10 compute-sanitizer --version
    step "python modules" 60 python3 -c '
import sys, importlib
print("python", sys.version.split()[0])
missing = []
for m in ("torch", "cupy", "jax", "jaxlib"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        missing.append(m); print(m, "missing:", e)
import torch
print("torch cuda", torch.version.cuda, torch.cuda.get_device_name(0))
sys.exit(1 if missing else 0)'
    uname -r
    ldd --version | head -1
    ;;
sanity)
    # 10 s. A machine whose CPU is starved (seen once: every program 1000x
    # slower) would waste the lease: stop early on one.
    d=$WORK/sanity
    mkdir -p "$d"
    step build 30 bash -c 'set -e; inc="-I$1/sim/include"
        gcc -O2 -fPIC -shared $inc -Wl,-soname,libcuda.so.1 -o "$2/libcuda.so.1" "$1/sim/driver.c" -lpthread
        gcc -O2 -fPIC -shared $inc -Wl,-soname,libcudart.so.12 -Wl,-rpath,"\$ORIGIN" -o "$2/libcudart.so.12" "$1/sim/runtime.c" -ldl -lpthread
        gcc -O2 $inc -o "$2/pairs" "$1/bench/pairs.c" "$2/libcudart.so.12" "$2/libcuda.so.1" -lpthread -ldl -Wl,-rpath,"$2"' _ "$ROOT" "$d"
    # LD_LIBRARY_PATH: CUDA images point it at the real driver, which would
    # win over the simulated one.
    ns=$(LD_LIBRARY_PATH=$d timeout 20 "$d/pairs" runtime 100000 20)
    if [ -n "$ns" ] && [ "${ns%.*}" -le 2000 ] 2>/dev/null; then
        record "sanity pairs" PASS "$ns ns per alloc/free pair without the library" "<= 2000 ns"
    else
        record "sanity pairs" FAIL "${ns:-timeout} ns per alloc/free pair without the library" "<= 2000 ns"
        echo "machine too slow for timings; stopping"
        FAILED_SECTIONS=" $SECTIONS"
        done_
    fi
    ;;
nvcc)
    # 60 s: build 15-25 s, three runs of a second each, compute-sanitizer.
    # Ground truth: the program's own account of its planted leaks
    # (`planted ...` lines of a plain run) and its "LEAK <api>" lines;
    # compute-sanitizer's leak list on the same binary.
    say "nvcc program, default static cudart: planted leaks"
    d=$WORK/nvcc
    mkdir -p "$d"
    if step build 120 nvcc -g -O0 -arch=sm_90 -o "$d/leaks" "$ROOT/gpu/leaks.cu" -lcuda; then
        nm "$d/leaks" | grep -c ' T cudaMalloc' | sed 's/^/static cudaMalloc symbols in the binary: /'
        ldd "$d/leaks" | grep -i cudart || echo "no libcudart in ldd: cudart is static"
        step "plain run" 30 bash -c '"$1" reset >"$2"' _ "$d/leaks" "$d/planted.txt"
        cat "$d/planted.txt"
        step "cudaleak run" 30 "$CLI" run --dir "$d/r" -- "$d/leaks"
        checks nvcc python3 "$CHECKER" nvcc "$d/r" "$d/planted.txt" --name nvcc
        step "cudaleak run reset" 30 "$CLI" run --dir "$d/r-reset" -- "$d/leaks" reset
        step compute-sanitizer 90 bash -c 'compute-sanitizer --leak-check full "$1" reset >"$2" 2>&1' _ "$d/leaks" "$d/sanitizer.txt"
        grep -E 'Leaked|LEAK SUMMARY|ERROR SUMMARY' "$d/sanitizer.txt"
        checks "nvcc reset" python3 "$CHECKER" nvcc "$d/r-reset" "$d/planted.txt" --name "nvcc reset" --sanitizer "$d/sanitizer.txt"
    fi
    ;;
python)
    # 25 s. Python frames on the simulated driver; ground truth: the
    # "# LEAK <name>" lines of tests/python/stacks.py and its sizes.
    say "Python $(python3 -c 'import sys; print(sys.version.split()[0])') frames on the simulated driver"
    d=$WORK/py
    mkdir -p "$d"
    step build 60 bash -c 'set -e; inc="-I$1/sim/include"
        gcc -O2 -g -fPIC -shared $inc -Wl,-soname,libcuda.so.1 -o "$2/libcuda.so.1" "$1/sim/driver.c" -lpthread
        gcc -O2 -g -fPIC -shared $inc -Wl,-soname,libcudart.so.12 -Wl,-rpath,"\$ORIGIN" -o "$2/libcudart.so.12" "$1/sim/runtime.c" -ldl -lpthread
        gcc -O0 -g -fPIC -shared $inc -I"$1/tests/c" -o "$2/libpy_helper.so" "$1/tests/c/py_helper.c" "$2/libcudart.so.12" -lpthread -Wl,-rpath,"$2"' _ "$ROOT" "$d"
    for m in all deadlock; do
        step "stacks.py $m" 60 env LD_LIBRARY_PATH="$d" CUDALEAK_SUMMARY=0 SIMCUDA_RUNTIME="$d/libcudart.so.12" \
            CUDALEAK_PY_HELPER="$d/libpy_helper.so" "$CLI" run --dir "$d/$m" -- python3 "$ROOT/tests/python/stacks.py" $m
        checks "stacks.py $m" python3 "$CHECKER" stacks "$d/$m" $m
    done
    ;;
torch)
    # 130 s: six runs of 8-15 s (torch import, CUDA init), their checks.
    # Ground truth: the tensors the script kept (numel * element_size),
    # the "# LEAK" lines of gpu/torch_checks.py.
    d=$WORK/torch
    mkdir -p "$d"
    say "PyTorch, --pytorch-no-cache: a tensor kept per step, live dump"
    step "leak no-cache" 60 env GPU_CHECK_TRUTH="$d/leak.truth.json" "$CLI" run --pytorch-no-cache --dir "$d/leak" -- python3 "$TORCH" leak
    LINES_MAX=12 reports --top 3 "$d"/leak/*.api.json
    checks "leak no-cache" python3 "$TORCH" verify leak no-cache "$d/leak" "$d/leak.truth.json"
    say "PyTorch, --pytorch-no-cache: checkpoint region clean, then leaky"
    step "clean no-cache" 60 env GPU_CHECK_TRUTH="$d/clean.truth.json" "$CLI" run --pytorch-no-cache --dir "$d/clean" -- python3 "$TORCH" clean
    checks "clean no-cache" python3 "$TORCH" verify clean no-cache "$d/clean" "$d/clean.truth.json"
    say "PyTorch, default caching allocator: three SIGUSR1 dumps"
    for v in phases phases-clean; do
        step "$v default" 60 env GPU_CHECK_TRUTH="$d/$v.truth.json" "$CLI" run --dir "$d/$v" -- python3 "$TORCH" "$v"
        checks "$v default" python3 "$TORCH" verify "$v" default "$d/$v" "$d/$v.truth.json"
    done
    for preset in expandable async; do
        conf=expandable_segments:True
        [ "$preset" = async ] && conf=backend:cudaMallocAsync
        say "PyTorch, PYTORCH_CUDA_ALLOC_CONF=$conf: a tensor kept per step, live dump"
        step "leak $preset" 60 env PYTORCH_CUDA_ALLOC_CONF="$conf" GPU_CHECK_TRUTH="$d/$preset.truth.json" \
            "$CLI" run --dir "$d/$preset" -- python3 "$TORCH" leak
        checks "leak $preset" python3 "$TORCH" verify leak "$preset" "$d/$preset" "$d/$preset.truth.json"
    done
    ;;
oom)
    # 95 s: five runs of 8-15 s. A real PyTorch out-of-memory error and the
    # peak of a step, under the default caching allocator and under
    # --pytorch; the error also with expandable segments. Ground truth: the OutOfMemoryError message,
    # torch.cuda.memory_reserved/memory_allocated/mem_get_info before the
    # request, max_memory_allocated/max_memory_reserved after the step.
    d=$WORK/oom
    mkdir -p "$d"
    for preset in default pytorch expandable; do
        flags=()
        conf=()
        [ "$preset" = pytorch ] && flags=(--pytorch)
        [ "$preset" = expandable ] && conf=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
        say "PyTorch out of memory ($preset)"
        step "oom $preset" 60 env "${conf[@]}" GPU_CHECK_TRUTH="$d/oom-$preset.truth.json" \
            "$CLI" run "${flags[@]}" --dir "$d/oom-$preset" -- python3 "$TORCH" oom
        for f in "$d/oom-$preset"/*.oom.json; do LINES_MAX=25 reports --top 5 "$f"; done
        checks "oom $preset" python3 "$TORCH" verify oom "$preset" "$d/oom-$preset" "$d/oom-$preset.truth.json"
        # Expandable segments: the out-of-memory path only (the peak of
        # the caching allocator is measured under the default).
        [ "$preset" = expandable ] && continue
        say "PyTorch peak of a training step ($preset)"
        step "peak $preset" 60 env GPU_CHECK_TRUTH="$d/peak-$preset.truth.json" \
            "$CLI" run "${flags[@]}" --dir "$d/peak-$preset" -- python3 "$TORCH" peak
        checks "peak $preset" python3 "$TORCH" verify peak "$preset" "$d/peak-$preset" "$d/peak-$preset.truth.json"
    done
    ;;
frameworks)
    # 70 s: CuPy 10 s, JAX 20-30 s (XLA's first compile). Ground truth: the
    # sizes the script asked for, its "# LEAK" lines.
    d=$WORK/fw
    mkdir -p "$d"
    say "CuPy: planted leaks through the runtime and a memory pool"
    step cupy 60 env GPU_CHECK_TRUTH="$d/cupy.truth.json" "$CLI" run --dir "$d/cupy" -- python3 "$FW" cupy
    checks cupy python3 "$FW" verify cupy "$d/cupy" "$d/cupy.truth.json"
    say "JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform: planted leaks"
    step jax 90 env GPU_CHECK_TRUTH="$d/jax.truth.json" "$CLI" run --jax --dir "$d/jax" -- python3 "$FW" jax
    checks jax python3 "$FW" verify jax "$d/jax" "$d/jax.truth.json"
    ;;
libraries)
    # 50 s: two runs. An inventory of one-time allocations (they became
    # suppressions/default.supp); the checks are the runs' exit statuses.
    d=$WORK/lib
    mkdir -p "$d"
    for m in cublas nccl; do
        say "one-time allocations of $m (no caching, default suppressions off)"
        step "$m" 60 "$CLI" run --pytorch-no-cache --no-default-suppressions --dir "$d/$m" -- python3 "$TORCH" "$m"
        timeout "$(cap 30)" "$CLI" report --format json "$d/$m" | python3 -c '
import json, os, sys
r = json.load(sys.stdin)
for g in r["leaks"]:
    mods = []
    for f in g["native_stack"]:
        m = os.path.basename(f["module"] or "?")
        if m not in mods: mods.append(m)
    funcs = [f["function"] for f in g["native_stack"] if f["function"]][:4]
    print("%10d bytes %2d block(s) %-18s modules: %s" % (g["bytes"], g["blocks"], g["api"], ", ".join(mods[:6])))
    print("           top: %s" % " <- ".join(funcs))'
    done
    ;;
procaddr)
    # 15 s. Ground truth: what the driver's own cuGetProcAddress_v2 hands
    # out for each name and version of the hook table, asked by
    # gpu/procaddr_probe.c without the library.
    say "cuGetProcAddress_v2: the library's hooks for every hooked entry point"
    d=$WORK/procaddr
    mkdir -p "$d"
    if step build 30 gcc -O2 -o "$d/probe" "$ROOT/gpu/procaddr_probe.c" -ldl; then
        checks procaddr python3 "$ROOT/gpu/procaddr_checks.py" "$ART/libcudaleak.so" "$d/probe"
    fi
    ;;
untouched)
    # 40 s. Programs that allocate no GPU memory: the same exit status,
    # output and files with and without the library (gpu/untouched_checks.py;
    # the ground truth is the plain run).
    say "programs that allocate no GPU memory, with and without the library"
    UT=$ROOT/gpu/untouched_checks.py
    checks shell python3 "$UT" "$ART/libcudaleak.so" shell -- bash -c 'echo out; echo err >&2; ls / >/dev/null; exit 7'
    checks python python3 "$UT" "$ART/libcudaleak.so" python -- python3 -c 'import json, sys; print(json.dumps(sys.argv)); sys.exit(3)'
    checks nvidia-smi python3 "$UT" "$ART/libcudaleak.so" nvidia-smi -- nvidia-smi -L
    checks "import torch" python3 "$UT" "$ART/libcudaleak.so" "import torch" -- \
        python3 -c 'import torch; print(torch.__version__, torch.cuda.is_initialized())'
    checks "torch query" python3 "$UT" "$ART/libcudaleak.so" "torch query" --cuda -- \
        python3 -c 'import torch; print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0))'
    ;;
ranks)
    # 60 s: two runs of torchrun with 2 ranks on one GPU (gloo), 15-25 s
    # each. Ground truth: what each rank kept (its truth file), the gate's
    # exit status (23 with a leak at exit, else 0).
    d=$WORK/ranks
    mkdir -p "$d"
    for v in ranks ranks-clean; do
        say "torchrun, 2 ranks on one GPU (gloo), cudaleak run --pytorch --fail-on-leak: $v"
        step "$v" 90 bash -c '"${@:2}"; echo $? >"$1"' _ "$d/$v.truth.json.status" \
            env GPU_CHECK_TRUTH="$d/$v.truth.json" "$CLI" run --pytorch --fail-on-leak --dir "$d/$v" -- \
            python3 -m torch.distributed.run --standalone --nproc-per-node 2 "$TORCH" "$v"
        LINES_MAX=30 reports "$d/$v"
        checks "$v" python3 "$TORCH" verify "$v" pytorch "$d/$v" "$d/$v.truth.json"
    done
    ;;
live)
    # 40 s: `cudaleak top PID --once` and the metrics file while a PyTorch
    # program (no cache) holds still, against memory_allocated() and the
    # driver's mem_get_info() (gpu/live_checks.py).
    d=$WORK/live
    mkdir -p "$d/metrics"
    say "live view and metrics by device, PyTorch without its cache"
    env CUDALEAK_METRICS_DIR="$d/metrics" CUDALEAK_METRICS_INTERVAL=0.5 GPU_CHECK_TRUTH="$d/truth.json" \
        LIVE_GO="$d/go" timeout -k 5 "$(cap 90)" "$CLI" run --pytorch-no-cache --dir "$d/reports" -- \
        python3 "$ROOT/gpu/live_checks.py" run >"$d/run.log" 2>&1 &
    runner=$!
    step "program ready" 60 bash -c 'until [ -s "$1" ]; do kill -0 "$2" 2>/dev/null || exit 1; sleep 0.2; done' _ "$d/truth.json" "$runner"
    pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$d/truth.json" 2>/dev/null)
    # Two metrics writes after the truth was taken.
    sleep 1.5
    step "top --once" 30 bash -c '"$1" top "$2" --once --format json >"$3"' _ "$CLI" "${pid:-0}" "$d/view.json"
    cp "$d"/metrics/*.prom "$d/metrics.prom" 2>/dev/null
    touch "$d/go"
    wait "$runner"
    tail -5 "$d/run.log"
    checks "live" python3 "$ROOT/gpu/live_checks.py" verify "$d/truth.json" "$d/view.json" "$d/metrics.prom"
    ;;
graphs)
    # 40 s: three builds at once 10-15 s, eleven plain runs and eleven runs
    # under cudaleak of about a second each (last in the default: a hang
    # here cannot starve the older sections). gpu/graphs_resets.cu, nvcc's
    # default static cudart: graph memory-alloc and free nodes, stream
    # capture, AutoFreeOnLaunch, cudaDeviceGraphMemTrim, cudaDeviceReset and
    # cudaThreadExit between two cudaMalloc calls, cudaMallocFromPoolAsync
    # (and its _ptsz form, built with --default-stream per-thread), modules
    # loaded with cuModuleLoad (gpu/module_globals.cu, a 1 MiB global).
    # Ground truth: the "LEAK <name>"/"CLEAN <name>" lines of the source and
    # the program's own account (`leak`/`clean`/`dump` lines of a plain run,
    # which the run under cudaleak must repeat); check_report.py
    # GRAPH_MODES states what each mode plants.
    say "nvcc program, static cudart: graph memory, stream capture, context resets, pools, modules"
    d=$WORK/graphs
    mkdir -p "$d"
    modes="graph_leak graph_paired capture auto_free trim reset_peak thread_exit pool pool_ptsz module module_loop"
    if step build 120 bash -c 'cd "$2" || exit 1
        nvcc -g -O0 -arch=sm_90 -o graphs "$1/gpu/graphs_resets.cu" -lcuda -ldl & a=$!
        nvcc -g -O0 -arch=sm_90 --default-stream per-thread -o graphs_ptsz "$1/gpu/graphs_resets.cu" -lcuda -ldl & b=$!
        nvcc -cubin -arch=sm_90 -o globals.cubin "$1/gpu/module_globals.cu" & c=$!
        wait $a; ra=$?; wait $b; rb=$?; wait $c; rc=$?
        exit $((ra || rb || rc))' _ "$ROOT" "$d"; then
        # The account of each mode without the library; a mode that fails
        # alone fails this step (and its account check).
        step "plain runs" 60 bash -c 'd=$1; shift; st=0
            for m in "$@"; do
                b=$d/graphs; [ "$m" = pool_ptsz ] && b=$d/graphs_ptsz
                a=(); case $m in module*) a=("$d/globals.cubin") ;; esac
                "$b" "$m" "${a[@]}" >"$d/$m.planted.txt" || { echo "plain run $m: exit $?"; st=1; }
                sed "s/^/  $m: /" "$d/$m.planted.txt"
            done
            exit $st' _ "$d" $modes
        for m in $modes; do
            bin=$d/graphs
            [ "$m" = pool_ptsz ] && bin=$d/graphs_ptsz
            args=("$m")
            case $m in module*) args+=("$d/globals.cubin") ;; esac
            # A module loaded once and never unloaded does not fail the gate.
            gate=()
            [ "$m" = module ] && gate=(--fail-on-leak)
            step "run${gate:+ ${gate[*]}} $m" 20 bash -c 'set -o pipefail; out=$1; shift; "$@" | tee "$out"' _ "$d/$m.run.txt" \
                "$CLI" run "${gate[@]}" --dir "$d/$m" -- "$bin" "${args[@]}"
            checks "$m" python3 "$CHECKER" graphs "$d/$m" "$m" "$d/$m.planted.txt" --under "$d/$m.run.txt"
        done
        LINES_MAX=16 reports "$d/reset_peak"
    fi
    ;;
torch-dump)
    # 40 s (extra): the no-cache leak run again, with its checks.
    d=$WORK/torch-dump
    mkdir -p "$d"
    say "PyTorch, no caching: a tensor kept per step, live dump at the end"
    step leak 60 env GPU_CHECK_TRUTH="$d/leak.truth.json" "$CLI" run --pytorch-no-cache --dir "$d/leak" -- python3 "$TORCH" leak
    for f in "$d"/leak/*.api.json; do LINES_MAX=40 reports --top 3 "$f"; done
    checks "leak no-cache" python3 "$TORCH" verify leak no-cache "$d/leak" "$d/leak.truth.json"
    ;;
overhead)
    # 150 s (extra): a measurement, not a check. The configurations in
    # turn, round after round (gpu/step_overhead.py): OVERHEAD_ROUNDS
    # (default 5), OVERHEAD_STEPS steps a run (default 500),
    # OVERHEAD_MODEL (small: a 1 ms MLP step, the worst case; large: 8
    # Linear 4096 layers, a step of real size),
    # OVERHEAD_CONFIGS (default none cudaleak none-async cudaleak-async;
    # also none-nocache cudaleak-nocache).
    say "overhead of a training step (MLP 512-512-10, batch 128), configurations interleaved"
    step overhead 600 python3 "$ROOT/gpu/step_overhead.py" "$ART/libcudaleak.so" "$(left)" ${OVERHEAD_CONFIGS:-}
    ;;
bench)
    # Extra: whatever the deadline leaves (alone: up to 450 s).
    say "scripts/bench.py on this machine ($(nproc) CPUs)"
    mkdir -p "$ROOT/target/release" && cp "$ART/libcudaleak.so" "$ROOT/target/release/" 2>/dev/null
    step bench 540 python3 "$ROOT/scripts/bench.py" --runs 3 --threads 1,2,4,8,16
    ;;
*)
    record "setup section $s" FAIL "unknown section" "one of env sanity nvcc python torch oom frameworks libraries procaddr untouched ranks live graphs torch-dump overhead bench"
    ;;
esac
(($(failures) > before)) && FAILED_SECTIONS+=" $s"
done
done_

#!/usr/bin/env bash
# cudaleak on a real GPU: PyTorch, CuPy, JAX, NCCL/cuBLAS and nvcc programs.
# Results feed docs/gpu-validation.md.
#
#   scripts/gpu-validate.sh ARTIFACTS OUT [SECTION...]
#
# ARTIFACTS holds libcudaleak.so and cudaleak, built elsewhere with
# `cargo build --release` (the GPU machine has no cargo); OUT receives
# summary.txt (everything printed) and reports.tar.gz. Sections: env nvcc
# python torch oom frameworks libraries overhead bench (default: all). Needs
# nvidia-smi, nvcc, gcc and python3 with torch, cupy and jax installed.
set -uo pipefail
ART=$(realpath "$1")
OUT=$(realpath "$2")
shift 2
SECTIONS=${*:-env nvcc python torch oom frameworks libraries overhead bench}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/cudaleak-gpu.XXXXXX)
CLI="$ART/cudaleak"
export CUDALEAK_LIBRARY="$ART/libcudaleak.so"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee -a "$OUT/summary.txt") 2>&1

say() { printf '\n=== %s\n' "$*"; }
# run LABEL SECONDS CMD...: a step with a time limit and its wall time
step() {
    local label=$1 limit=$2
    shift 2
    echo "--- $label: $*"
    local t0 rc
    t0=$(date +%s%N)
    timeout "$limit" "$@"
    rc=$?
    echo "--- $label: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    return 0
}
reports() { "$CLI" report "$@" 2>&1 | head -${LINES_MAX:-120}; }

for s in $SECTIONS; do
case $s in
env)
    say "environment ($(date -u +%Y-%m-%dT%H:%MZ))"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    nvcc --version | tail -2
    python3 -c 'import sys; print("python", sys.version.split()[0])'
    for m in torch cupy jax jaxlib; do python3 -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
    python3 -c 'import torch; print("torch cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
    compute-sanitizer --version | head -2
    uname -r; ldd --version | head -1
    ;;
nvcc)
    say "nvcc program, default static cudart: planted leaks"
    d=$WORK/nvcc; mkdir -p "$d"
    step build 300 nvcc -g -O0 -arch=sm_90 -o "$d/leaks" "$ROOT/gpu/leaks.cu" -lcuda
    nm "$d/leaks" | grep -c ' T cudaMalloc' | sed 's/^/static cudaMalloc symbols in the binary: /'
    ldd "$d/leaks" | grep -i cudart || echo "no libcudart in ldd: cudart is static"
    step "cudaleak run" 120 "$CLI" run --dir "$d/r" -- "$d/leaks"
    reports "$d/r"
    step "cudaleak run, with cudaDeviceReset" 120 "$CLI" run --dir "$d/r-reset" -- "$d/leaks" reset
    reports --format json "$d/r-reset" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for g in r["leaks"]:
    top = next((f for f in g["native_stack"] if f["function"]), {})
    print("%10d bytes %d block(s) %-18s %-8s %s:%s" % (g["bytes"], g["blocks"], g["api"], g["memory"], top.get("function"), top.get("line")))'
    step "plain run" 120 "$d/leaks" reset
    step "compute-sanitizer --leak-check full" 300 compute-sanitizer --leak-check full "$d/leaks" reset
    ;;
python)
    say "Python $(python3 -c 'import sys; print(sys.version.split()[0])') frames on the simulated driver"
    d=$WORK/py; mkdir -p "$d"
    inc="-I$ROOT/sim/include"
    gcc -O2 -g -fPIC -shared $inc -Wl,-soname,libcuda.so.1 -o "$d/libcuda.so.1" "$ROOT/sim/driver.c" -lpthread
    gcc -O2 -g -fPIC -shared $inc -Wl,-soname,libcudart.so.12 -Wl,-rpath,'$ORIGIN' -o "$d/libcudart.so.12" "$ROOT/sim/runtime.c" -ldl -lpthread
    gcc -O0 -g -fPIC -shared $inc -I"$ROOT/tests/c" -o "$d/libpy_helper.so" "$ROOT/tests/c/py_helper.c" "$d/libcudart.so.12" -lpthread -Wl,-rpath,"$d"
    export SIMCUDA_RUNTIME=$d/libcudart.so.12 CUDALEAK_PY_HELPER=$d/libpy_helper.so
    for m in all deadlock; do
        step "stacks.py $m" 120 env LD_LIBRARY_PATH="$d" CUDALEAK_SUMMARY=0 "$CLI" run --dir "$d/$m" -- python3 "$ROOT/tests/python/stacks.py" $m
        "$CLI" report --format json "$d/$m" | python3 -c '
import json, sys
r = json.load(sys.stdin)
print("python capture:", r.get("python"))
for g in r["leaks"]:
    print(g["bytes"], g["blocks"], " <- ".join("%s:%s" % (f["function"], f["line"]) for f in g["python_stack"][:4]))'
    done
    unset SIMCUDA_RUNTIME CUDALEAK_PY_HELPER
    ;;
torch)
    d=$WORK/torch; mkdir -p "$d"
    say "PyTorch, PYTORCH_NO_CUDA_MEMORY_CACHING=1: a tensor kept per step"
    step leak 300 "$CLI" run --pytorch-no-cache --dir "$d/leak" -- python3 "$ROOT/gpu/torch_checks.py" leak
    "$CLI" report --format json "$d/leak" | python3 -c '
import json, sys
r = json.load(sys.stdin)
for g in r["leaks"][:12]:
    py = " <- ".join("%s:%s" % (f["function"], f["line"]) for f in g["python_stack"][:3])
    print("%10d bytes %3d block(s) %-16s %s" % (g["bytes"], g["blocks"], g["api"], py or "(no Python frames)"))'
    say "PyTorch, no caching: checkpoint region clean, then leaky"
    step clean 300 "$CLI" run --pytorch-no-cache --dir "$d/clean" -- python3 "$ROOT/gpu/torch_checks.py" clean
    say "PyTorch, default caching allocator: three SIGUSR1 dumps"
    for v in phases phases-clean; do
        step "$v" 300 "$CLI" run --dir "$d/$v" -- python3 "$ROOT/gpu/torch_checks.py" $v
        for f in "$d/$v"/*.3.signal.json; do LINES_MAX=60 reports "$f"; done
    done
    for conf in expandable_segments:True backend:cudaMallocAsync; do
        say "PyTorch, PYTORCH_CUDA_ALLOC_CONF=$conf: a tensor kept per step"
        step "leak $conf" 300 env PYTORCH_CUDA_ALLOC_CONF=$conf "$CLI" run --dir "$d/$conf" -- python3 "$ROOT/gpu/torch_checks.py" leak
        LINES_MAX=80 reports "$d/$conf"
    done
    ;;
oom)
    # Issue 21: a real PyTorch out-of-memory error and the peak of a step,
    # under the default caching allocator and under --pytorch.
    d=$WORK/oom; mkdir -p "$d"
    for preset in default --pytorch; do
        flag=${preset#default}
        say "PyTorch out of memory ($preset)"
        step "oom $preset" 300 "$CLI" run $flag --dir "$d/oom$flag" -- python3 "$ROOT/gpu/torch_checks.py" oom
        for f in "$d/oom$flag"/*.oom.json; do LINES_MAX=60 reports "$f"; done
        say "PyTorch peak of a training step ($preset)"
        step "peak $preset" 300 "$CLI" run $flag --dir "$d/peak$flag" -- python3 "$ROOT/gpu/torch_checks.py" peak
        for f in "$d/peak$flag"/*.api.json; do
            "$CLI" report --format json "$f" | python3 -c '
import json, sys
r = json.load(sys.stdin)
p = r.get("peak") or {}
print("peak_bytes", r["totals"]["peak_bytes"], "peak groups", len(p.get("groups", [])), "sum", sum(g["bytes"] for g in p.get("groups", [])))
for g in p.get("groups", [])[:8]:
    py = " <- ".join("%s:%s" % (f["function"], f["line"]) for f in g["python_stack"][:3])
    print("%12d bytes %4d block(s) %-16s%s %s" % (g["bytes"], g["blocks"], g["api"], " [cache]" if g.get("pytorch_cache_segment") else "", py))'
        done
    done
    ;;
frameworks)
    d=$WORK/fw; mkdir -p "$d"
    say "CuPy: planted leaks through the runtime and a memory pool"
    step cupy 300 "$CLI" run --dir "$d/cupy" -- python3 "$ROOT/gpu/cupy_jax_checks.py" cupy
    say "JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform: planted leaks"
    step jax 300 "$CLI" run --jax --dir "$d/jax" -- python3 "$ROOT/gpu/cupy_jax_checks.py" jax
    LINES_MAX=60 reports "$d/jax"
    ;;
libraries)
    d=$WORK/lib; mkdir -p "$d"
    for m in cublas nccl; do
        say "one-time allocations of $m (no caching, default suppressions off)"
        step $m 300 "$CLI" run --pytorch-no-cache --no-default-suppressions --dir "$d/$m" -- python3 "$ROOT/gpu/torch_checks.py" $m
        "$CLI" report --format json "$d/$m" | python3 -c '
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
overhead)
    say "overhead of a training step (MLP 512-512-10, batch 128), median of 3"
    for cfg in none cudaleak cudaleak-nocache none-nocache none-async cudaleak-async; do
        times=()
        for i in 1 2 3; do
            case $cfg in
                none) t=$(python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
                none-nocache) t=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
                cudaleak) t=$(CUDALEAK_DIR=$WORK CUDALEAK_SUMMARY=0 LD_PRELOAD=$ART/libcudaleak.so python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
                cudaleak-nocache) t=$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDALEAK_DIR=$WORK CUDALEAK_SUMMARY=0 LD_PRELOAD=$ART/libcudaleak.so python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
                # what `cudaleak run --pytorch` sets (issue 21)
                none-async) t=$(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
                cudaleak-async) t=$(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync CUDALEAK_DIR=$WORK CUDALEAK_SUMMARY=0 LD_PRELOAD=$ART/libcudaleak.so python3 "$ROOT/gpu/torch_checks.py" overhead) ;;
            esac
            times+=("${t%% *}")
        done
        printf '%-18s %s ms/step (runs: %s)\n' "$cfg" "$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)" "${times[*]}"
    done
    ;;
sanity)
    # A machine whose CPU is starved (seen once here: every program 1000x
    # slower) would waste the lease: stop early on one.
    d=$WORK/sanity; mkdir -p "$d"
    inc="-I$ROOT/sim/include"
    gcc -O2 -fPIC -shared $inc -Wl,-soname,libcuda.so.1 -o "$d/libcuda.so.1" "$ROOT/sim/driver.c" -lpthread
    gcc -O2 -fPIC -shared $inc -Wl,-soname,libcudart.so.12 -Wl,-rpath,'$ORIGIN' -o "$d/libcudart.so.12" "$ROOT/sim/runtime.c" -ldl -lpthread
    gcc -O2 $inc -o "$d/pairs" "$ROOT/bench/pairs.c" "$d/libcudart.so.12" "$d/libcuda.so.1" -lpthread -ldl -Wl,-rpath,"$d"
    # LD_LIBRARY_PATH: CUDA images point it at the real driver, which would
    # win over the simulated one.
    ns=$(LD_LIBRARY_PATH=$d timeout 20 "$d/pairs" runtime 100000 20)
    echo "sanity: ${ns:-timeout} ns per pair without the library"
    if [ -z "$ns" ] || [ "${ns%.*}" -gt 2000 ]; then echo "machine too slow for timings; stopping"; exit 3; fi
    ;;
torch-dump)
    d=$WORK/torch; mkdir -p "$d"
    say "PyTorch, no caching: a tensor kept per step, live dump at the end"
    step leak 300 "$CLI" run --pytorch-no-cache --dir "$d/leak-dump" -- python3 "$ROOT/gpu/torch_checks.py" leak
    for f in "$d/leak-dump"/*.api.json; do LINES_MAX=40 reports --top 3 "$f"; done
    ;;
bench)
    say "scripts/bench.py on this machine ($(nproc) CPUs)"
    mkdir -p "$ROOT/target/release" && cp "$ART/libcudaleak.so" "$ROOT/target/release/" 2>/dev/null
    step bench 540 python3 "$ROOT/scripts/bench.py" --runs 3 --threads 1,2,4,8,16
    ;;
esac
done
find "$WORK" -name 'cudaleak.*.json' -size -2M | tar czf "$OUT/reports.tar.gz" -T - 2>/dev/null
echo "done: $OUT"

"""CuPy (static cudart) and JAX (platform allocator) under cudaleak.

    python3 cupy_jax_checks.py cupy|jax
        the workload, run under cudaleak: planted leaks after a checkpoint,
        then a live dump; its ground truth (the sizes it asked for) goes to
        $GPU_CHECK_TRUTH
    python3 cupy_jax_checks.py verify cupy|jax REPORT_DIR TRUTH_JSON
        the checks, outside the preload: one CHECK line each

Planted lines are marked by a comment, LEAK <name>; the checks find them
here.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_report as cr  # noqa: E402
from check_report import MiB, check, fmt_bytes, marker_line  # noqa: E402

SRC = os.path.abspath(__file__)
KEPT = []

# CuPy's memory pool rounds requests up to 512 B (its allocation unit).
CUPY_UNIT = 512
# XLA's platform allocator maps each buffer with the VMM calls: physical
# memory in multiples of the device's granularity (2 MiB on H100/H200).
VMM_GRANULARITY = 2 * MiB


def cupy_check():
    import cupy

    import cudaleak

    cupy.ones(16).sum()  # initialization, memory pool
    n_runtime, n_pool = 1 << 20, 3 << 20
    cp = cudaleak.checkpoint()
    KEPT.append(cupy.cuda.runtime.malloc(n_runtime))  # LEAK cupy runtime
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        KEPT.append(cupy.empty(n_pool, dtype=cupy.uint8))  # LEAK cupy pool
    cupy.cuda.runtime.deviceSynchronize()
    report = cudaleak.leaks_since(cp)
    live = cudaleak.live_since(cp)
    print("live since checkpoint:", live)
    print(cudaleak.format_groups(report))
    dumped = cudaleak.dump("planted")
    cr.write_truth({"runtime_nbytes": n_runtime, "pool_nbytes": KEPT[-1].nbytes,
                    "live_since": list(live), "dumped": dumped})


def jax_check():
    import jax
    import jax.numpy as jnp
    import numpy as np

    import cudaleak

    jnp.ones(16).block_until_ready()  # initialization
    base = jnp.arange(1 << 20).block_until_ready()  # the input of the planted computation
    host = np.ones(1 << 20, np.float32)
    cp = cudaleak.checkpoint()
    KEPT.append(jax.device_put(host).block_until_ready())  # LEAK jax device_put
    KEPT.append((base * 2).block_until_ready())  # LEAK jax compute
    report = cudaleak.leaks_since(cp)
    print("live since checkpoint:", cudaleak.live_since(cp))
    print(cudaleak.format_groups(report))
    dumped = cudaleak.dump("planted")
    cr.write_truth({"device_put_nbytes": KEPT[0].nbytes, "compute_nbytes": KEPT[1].nbytes, "dumped": dumped})


# --- Checks (outside the preload) ---------------------------------------------


def _planted(report_dir, name, truth):
    files = cr.report_files(report_dir, "api")
    check("%s dump" % name, truth["dumped"] and len(files) >= 1,
          "dump() returned %s; %d api report(s)" % (truth["dumped"], len(files)), "a live dump")
    if not files:
        raise FileNotFoundError("no api report in %s" % report_dir)
    return cr.load_report(files[-1])


def verify_cupy(report_dir, truth, name="cupy"):
    r = _planted(report_dir, name, truth)
    want_total = 0
    for marker, want, unit, how in (
        ("LEAK cupy runtime", truth["runtime_nbytes"], 1, "exact (cudaMalloc of the size asked)"),
        ("LEAK cupy pool", truth["pool_nbytes"], CUPY_UNIT, "exact: the array's nbytes rounded up to 512 B (CuPy's pool unit)"),
    ):
        line = marker_line(SRC, marker)
        gs = cr.groups_at(r, line, file=SRC, function="cupy_check")
        blocks, got = cr.total(gs)
        expect = cr.round_up(want, unit)
        want_total += expect
        apis = sorted(set(g["api"] for g in gs))
        check("%s %s" % (name, marker.split()[-1]), (blocks, got) == (1, expect),
              "%d block(s) %d B (%s) at cupy_jax_checks.py line %d; asked %d B" % (blocks, got, ",".join(apis) or "-", line, want),
              how)
    live = tuple(truth["live_since"])
    check("%s live_since" % name, live == (2, want_total),
          "cudaleak.live_since(checkpoint) %s; planted (2, %d)" % (live, want_total), "exact")


def verify_jax(report_dir, truth, name="jax"):
    r = _planted(report_dir, name, truth)
    for marker, want in (("LEAK jax device_put", truth["device_put_nbytes"]), ("LEAK jax compute", truth["compute_nbytes"])):
        line = marker_line(SRC, marker)
        gs = cr.groups_at(r, line, file=SRC, function="jax_check")
        # Memory a buffer holds: cuMemCreate (physical) or cuMemAlloc
        # (device); the cuMemAddressReserve groups beside them are address space.
        held = [g for g in gs if g["memory"] in ("physical", "device") and not g.get("memory_kind")]
        got = cr.total(held)[1]
        hi = cr.round_up(want, VMM_GRANULARITY)
        check("%s %s" % (name, marker.split()[-1]), want <= got <= hi,
              "%s in %d group(s) (%s) at cupy_jax_checks.py line %d; array nbytes %d B"
              % (fmt_bytes(got), len(held), ",".join(sorted(set(g["api"] for g in held))) or "-", line, want),
              "nbytes up to nbytes rounded up to 2 MiB (the VMM granularity)")


if __name__ == "__main__":
    if sys.argv[1] == "verify":
        kind, report_dir, truth_path = sys.argv[2:5]

        @cr.guarded(kind)
        def run():
            {"cupy": verify_cupy, "jax": verify_jax}[kind](report_dir, cr.read_truth(truth_path))

        run()
        cr.finish()
    {"cupy": cupy_check, "jax": jax_check}[sys.argv[1]]()

"""Running out of device memory from Python, through ctypes over the
simulated runtime, as tests/c/oom.c does from C (the tests give the
simulated device 64 MiB). The request's line is marked as such.

    python3 oom.py

Weights (32 MiB) are kept, a cache of 4 x 6 MiB is made; a request of
40 MiB fails; the cache is freed and the request tried again, which fails
again; exit 1, as a training script that gives up.
"""

import ctypes
import sys

import sim

MIB = 1 << 20
CUDA_ERROR_MEMORY_ALLOCATION = 2


def load_weights():
    return sim.malloc(32 * MIB)  # OOM weights


def fill_cache():
    return [sim.malloc(6 * MIB) for _ in range(4)]  # OOM cache


def request(nbytes):
    p = ctypes.c_void_p()
    rc = sim.RT.cudaMalloc(ctypes.byref(p), nbytes)  # OOM request
    print("request of %d bytes: rc=%d" % (nbytes, rc), flush=True)
    return rc


def step(cache):
    rc = request(40 * MIB)
    for block in cache:
        sim.free(block)
    return rc == CUDA_ERROR_MEMORY_ALLOCATION and request(40 * MIB) == CUDA_ERROR_MEMORY_ALLOCATION


def main():
    weights = load_weights()
    cache = fill_cache()
    if step(cache):
        sys.exit(1)
    sim.free(weights)


main()

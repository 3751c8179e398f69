"""Benchmark: N cudaMalloc/cudaFree pairs from Python, DEPTH Python frames
deep, through ctypes over the simulated runtime. Prints ns per pair.

    python3 py_pairs.py N DEPTH     (SIMCUDA_RUNTIME=path/to/libcudart.so.12)
"""

import ctypes
import os
import sys
import time

rt = ctypes.CDLL(os.environ["SIMCUDA_RUNTIME"])
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
rt.cudaFree.argtypes = [ctypes.c_void_p]


def work(n):
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    malloc, free = rt.cudaMalloc, rt.cudaFree
    t0 = time.perf_counter_ns()
    for _ in range(n):
        malloc(ref, 256)
        free(p)
    return time.perf_counter_ns() - t0


def nest(depth, n):
    if depth > 1:
        return nest(depth - 1, n)
    return work(n)


if __name__ == "__main__":
    n, depth = int(sys.argv[1]), int(sys.argv[2])
    nest(depth, 1000)  # warm-up: first calls, caches
    print("%.1f" % (nest(depth, n) / n))

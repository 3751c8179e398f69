"""Benchmark: a training step from Python, a real shape, through ctypes over
the simulated runtime, as bench/step.c's `train` shape: 2 GiB of weights
held (4 blocks of 512 MiB); a forward pass on the main thread allocates one
activation per op (4 KiB .. 2 MiB); a backward pass on a second, lasting
thread, per op in reverse, allocates and frees a gradient and frees the
forward's activation. Each op first does the program's own work: WORK
iterations of a Python loop (`py_step.py calibrate` prints how many make
10 µs). The allocating call is DEPTH Python frames deep: DEPTH - 7 of
nesting, the pass's function, `call`, 4 that depend on the op (16 call
sites per pass) and the call's own. 2 pairs per op.

    python3 py_step.py calibrate
    python3 py_step.py train STEPS OPS DEPTH    (SIMCUDA_RUNTIME=path/to/libcudart.so.12,
                                                 BENCH_WORK_ITERS=WORK)

Prints "incall X" (ns per pair inside the calls, by perf_counter_ns,
calls over 200 µs left out), "long_calls N" (those left out), "pairs N",
"units N" (steps), then the process's CPU ns per step (getrusage, user +
system, both threads), two warm-up steps not counted.
"""

import ctypes
import os
import resource
import sys
import threading
import time


def spin(n):
    """The program's own work."""
    x = 0
    for i in range(n):
        x ^= i
    return x


def cpu_ns():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e9


def calibrate():
    n, best = 100_000, float("inf")
    for _ in range(20):
        t0 = time.thread_time_ns()
        spin(n)
        best = min(best, time.thread_time_ns() - t0)
    print("%.0f" % (n * 10e3 / best))


def route_a(bits, level, fn, arg):
    if level == 4:
        return fn(arg)
    return (route_a if bits & (1 << level) else route_b)(bits, level + 1, fn, arg)


def route_b(bits, level, fn, arg):
    if level == 4:
        return fn(arg)
    return (route_a if bits & (1 << level) else route_b)(bits, level + 1, fn, arg)


def call(op, fn, arg):
    """fn(arg), 4 frames deeper, through frames that depend on op."""
    return (route_a if op & 1 else route_b)(op, 1, fn, arg)


def nest(depth, fn):
    if depth > 1:
        return nest(depth - 1, fn)
    return fn()


def main():
    if sys.argv[1] == "calibrate":
        return calibrate()
    steps, ops, depth = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    work = int(os.environ.get("BENCH_WORK_ITERS", "0"))
    rt = ctypes.CDLL(os.environ["SIMCUDA_RUNTIME"])
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    malloc, free = rt.cudaMalloc, rt.cudaFree

    # The time inside the calls (perf_counter_ns, the same cost with and
    # without the library), while the measured steps run; a call over
    # 200 µs (preempted) is left out and counted.
    clock = time.perf_counter_ns
    incall = [0, 0]  # ns, calls left out
    timing = []

    def timed(fn, *a):
        t = clock()
        r = fn(*a)
        t = clock() - t
        if timing:
            if t < 200_000:
                incall[0] += t
            else:
                incall[1] += 1
        return r

    def alloc(req):
        if timed(malloc, ctypes.byref(req[0]), req[1]):
            raise RuntimeError("cudaMalloc failed")

    def release(p):
        if timed(free, p):
            raise RuntimeError("cudaFree failed")

    weights = [ctypes.c_void_p() for _ in range(4)]
    for w in weights:
        alloc((w, 512 << 20))
    acts = [ctypes.c_void_p() for _ in range(ops)]
    go, done = threading.Semaphore(0), threading.Semaphore(0)
    stop = []

    def forward():
        for op in range(ops):
            spin(work)
            call(op, alloc, (acts[op], 4096 << (op % 10)))

    def backward():
        while True:
            go.acquire()
            if stop:
                return
            for op in range(ops - 1, -1, -1):
                spin(work)
                g = ctypes.c_void_p()
                call(op, alloc, (g, 4096 << (op % 10)))
                call(op, release, g)
                call(op, release, acts[op])
            done.release()

    bw = threading.Thread(target=nest, args=(depth - 7, backward))
    bw.start()

    def step():
        nest(depth - 7, forward)
        go.release()
        done.acquire()

    for _ in range(2):
        step()
    timing.append(1)
    t0 = cpu_ns()
    for _ in range(steps):
        step()
    t1 = cpu_ns()
    timing.clear()
    stop.append(1)
    go.release()
    bw.join()
    for w in weights:
        release(w)
    pairs = steps * 2 * ops
    print("incall %.1f\nlong_calls %d" % (incall[0] / pairs, incall[1]))
    print("pairs %d\nunits %d\n%.0f" % (pairs, steps, (t1 - t0) / steps))


if __name__ == "__main__":
    main()

"""Planted leaks from Python, through ctypes over the simulated runtime.
Every leaking line is marked "# LEAK <name>"; the tests find the lines.

    python3 stacks.py MODE
"""

import ctypes
import os
import sys
import threading

import sim

KEPT = []


def leak_gil_released():
    KEPT.append(sim.malloc(1001))  # LEAK cdll


def leak_gil_held():
    KEPT.append(sim.malloc(1002, lib=sim.RT_GIL))  # LEAK pydll


def thread_body():
    KEPT.append(sim.malloc(1003))  # LEAK thread


def inner_helper(n):
    KEPT.append(sim.malloc(n))  # LEAK inner


def outer_helper(n):
    inner_helper(n)  # LEAK outer


def generator():
    for size in (1004, 1004):
        KEPT.append(sim.malloc(size))  # LEAK generator
        yield size


class Model:
    def step(self):
        KEPT.append(sim.malloc(1006))  # LEAK method

    @classmethod
    def build(cls):
        KEPT.append(sim.malloc(1007))  # LEAK classmethod


class Buffer:
    def __init__(self, n):
        KEPT.append(sim.malloc(n))  # LEAK init


def make_buffers():
    # Enough calls for the interpreter to specialize the class call: 3.13
    # then enters __init__ through a shim frame that must not show.
    for _ in range(10):
        Buffer(1009)  # CALL init


def two_lines():
    # The same frames but for the line in this one: each allocation must
    # get its own line (a capture that reused the previous one's frames
    # would not).
    for _ in range(3):
        KEPT.append(sim.malloc(1010))  # LEAK line_a
        KEPT.append(sim.malloc(1011))  # LEAK line_b


def all_kinds():
    leak_gil_released()  # CALL cdll
    leak_gil_held()
    t = threading.Thread(target=thread_body, name="allocator")
    t.start()
    t.join()
    outer_helper(1005)
    list(generator())
    Model().step()
    Model.build()
    make_buffers()  # CALL make_buffers
    two_lines()


def clean():
    for i in range(200):
        p = sim.malloc(100 + i)
        q = sim.malloc(50, lib=sim.RT_GIL)
        sim.free(q, lib=sim.RT_GIL)
        sim.free(p)

    def worker():
        for _ in range(100):
            sim.free(sim.malloc(64))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def deadlock():
    """Thread A holds an application lock and allocates with the GIL
    released; thread B holds the GIL and blocks on that lock. A hook that
    wanted the GIL would hang here."""
    helper = ctypes.CDLL(os.environ["CUDALEAK_PY_HELPER"])
    libc_gil = ctypes.PyDLL(None)  # calls keep the GIL
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    out = ctypes.c_void_p()

    def thread_a():
        # Locks, waits 300 ms (B blocks meanwhile), allocates, unlocks.
        rc = helper.locked_alloc(mutex, ctypes.byref(out), ctypes.c_size_t(1008), 300)  # LEAK deadlock
        assert rc == 0, rc

    a = threading.Thread(target=thread_a)
    a.start()
    import time

    time.sleep(0.1)
    libc_gil.pthread_mutex_lock(mutex)  # blocks, holding the GIL, until A is done
    libc_gil.pthread_mutex_unlock(mutex)
    a.join()
    KEPT.append(out)


def allocate():
    KEPT.append(sim.malloc(1012))  # LEAK one_line


def train_step():
    allocate()  # CALL one_line


def one_line():
    # Long enough for the interpreter to specialize the calls on the way
    # (3.13: the same Python stack then came from two native call sites
    # inside _PyEval_EvalFrameDefault, and out as two groups).
    for _ in range(300):
        train_step()  # CALL train_step


def exit_now():
    leak_gil_released()
    os._exit(3)


class AllocatesWhenCollected:
    """Leaks `nbytes` from its __del__, through a ctypes function and
    arguments bound beforehand: at finalization, module globals (`sim`'s
    too) may already be gone."""

    def __init__(self, nbytes):
        self.malloc = sim.RT.cudaMalloc
        self.p = ctypes.c_void_p()
        self.ref = ctypes.byref(self.p)
        self.nbytes = nbytes

    def __del__(self):
        self.malloc(self.ref, self.nbytes)  # LEAK collected


def finalizing():
    # Collected now, while the interpreter runs: a Python stack.
    early = AllocatesWhenCollected(6006)
    del early
    # Collected when the interpreter clears this module at exit, after it
    # started finalizing: no Python stack.
    global AT_EXIT
    AT_EXIT = AllocatesWhenCollected(7007)


if __name__ == "__main__":
    modes = {
        "all": all_kinds,
        "clean": clean,
        "deadlock": deadlock,
        "exit_now": exit_now,
        "finalizing": finalizing,
        "one_line": one_line,
    }
    modes[sys.argv[1]]()

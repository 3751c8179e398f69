"""A leak from Python code that C code called back: the module calls libc's
qsort through ctypes, and qsort calls a Python comparator, which
allocates. The stack holds two eval-loop invocations with C frames (qsort,
libffi's closure) between them; the native walk stops at the outer one
and the report must still put each invocation's Python frames
in its place.

    python3 callback.py
"""

import ctypes

import sim

KEPT = []
LIBC = ctypes.CDLL(None)
COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def compare(a, b):
    if not KEPT:
        KEPT.append(sim.malloc(1201))  # LEAK callback
    return 0


def sort_with_callback():
    items = (ctypes.c_int * 4)(4, 3, 2, 1)
    LIBC.qsort(items, 4, ctypes.sizeof(ctypes.c_int), COMPARE(compare))  # CALL qsort


sort_with_callback()  # CALL module

"""ctypes access to cudaleak's simulated CUDA runtime (sim/runtime.c) for the
Python test scripts. SIMCUDA_RUNTIME is the path of libcudart.so.12; the
tests set it. ctypes.CDLL releases the GIL around each call, as PyTorch's
op dispatch does around cudaMalloc; ctypes.PyDLL keeps it."""

import ctypes
import os

_PATH = os.environ["SIMCUDA_RUNTIME"]
RT = ctypes.CDLL(_PATH)
RT_GIL = ctypes.PyDLL(_PATH)
for lib in (RT, RT_GIL):
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMalloc.restype = ctypes.c_int
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaFree.restype = ctypes.c_int


def malloc(nbytes, lib=RT):
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), nbytes)
    assert rc == 0, rc
    return p


def free(p, lib=RT):
    rc = lib.cudaFree(p)
    assert rc == 0, rc

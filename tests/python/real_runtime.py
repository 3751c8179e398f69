"""NVIDIA's real libcudart loaded with ctypes (tests/real_runtime.rs): the
codes of the calls a program makes first, one `name=code` line each, as
tests/c/real_runtime.c prints them."""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
size = ctypes.c_size_t
count, d, a, h = ctypes.c_int(-1), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
print("cudaGetDeviceCount=%d" % rt.cudaGetDeviceCount(ctypes.byref(count)))
e = rt.cudaMalloc(ctypes.byref(d), size(1 << 20))
print("cudaMalloc=%d" % e)
if e == 0:
    rt.cudaFree(d)
e = rt.cudaMallocAsync(ctypes.byref(a), size(1 << 20), None)
print("cudaMallocAsync=%d" % e)
if e == 0:
    rt.cudaFreeAsync(a, None)
    rt.cudaDeviceSynchronize()
e = rt.cudaMallocHost(ctypes.byref(h), size(1 << 16))
print("cudaMallocHost=%d" % e)
if e == 0:
    rt.cudaFreeHost(h)

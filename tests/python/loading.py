"""Loads a shared object that links libcudart the ways Python programs do:
ctypes.CDLL(path) in its default mode (RTLD_LOCAL), and an
extension module through import (RTLD_LOCAL too).

    loading.py ctypes PLUGIN.so
    loading.py extension DIR_WITH_cuda_ext
"""

import ctypes
import sys


def via_ctypes(path):
    lib = ctypes.CDLL(path)
    rc = lib.plugin_leak()
    assert rc == 0, "plugin_leak returned %d" % rc


def via_import(directory):
    sys.path.insert(0, directory)
    import cuda_ext

    rc = cuda_ext.leak()
    assert rc == 0, "cuda_ext.leak returned %d" % rc


if __name__ == "__main__":
    how, what = sys.argv[1], sys.argv[2]
    {"ctypes": via_ctypes, "extension": via_import}[how](what)
    print("ok")

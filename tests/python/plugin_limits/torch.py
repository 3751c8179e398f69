"""A stand-in for PyTorch in cudaleak's tests: records what cudaleak calls,
and has a caching allocator that keeps freed tensors' blocks until
empty_cache(), as PyTorch's does."""

import gc

import sim

CALLS = []
_CACHE = []


def _on_gc(phase, info):
    if phase == "start":
        CALLS.append("gc")


gc.callbacks.append(_on_gc)


class cuda(object):
    @staticmethod
    def is_initialized():
        return True

    @staticmethod
    def synchronize():
        CALLS.append("synchronize")

    @staticmethod
    def empty_cache():
        CALLS.append("empty_cache")
        while _CACHE:
            sim.free(_CACHE.pop())


def tensor_freed_into_the_cache(nbytes):
    """A tensor made and dropped: its block stays with the allocator."""
    _CACHE.append(sim.malloc(nbytes))

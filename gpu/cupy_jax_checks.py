"""CuPy (static cudart) and JAX (platform allocator) under cudaleak.

    python3 cupy_jax_checks.py cupy|jax
"""

import sys

import cudaleak

KEPT = []


def cupy_check():
    import cupy

    cupy.ones(16).sum()  # initialization, memory pool
    cp = cudaleak.checkpoint()
    KEPT.append(cupy.cuda.runtime.malloc(1 << 20))  # LEAK cupy runtime
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        KEPT.append(cupy.empty(3 << 20, dtype=cupy.uint8))  # LEAK cupy pool
    cupy.cuda.runtime.deviceSynchronize()
    report = cudaleak.leaks_since(cp)
    print("live since checkpoint:", cudaleak.live_since(cp))
    print(cudaleak.format_groups(report))


def jax_check():
    import jax
    import jax.numpy as jnp
    import numpy as np

    jnp.ones(16).block_until_ready()  # initialization
    cp = cudaleak.checkpoint()
    KEPT.append(jax.device_put(np.ones(1 << 20, np.float32)).block_until_ready())  # LEAK jax device_put
    KEPT.append((jnp.arange(1 << 20) * 2).block_until_ready())  # LEAK jax compute
    report = cudaleak.leaks_since(cp)
    print("live since checkpoint:", cudaleak.live_since(cp))
    print(cudaleak.format_groups(report))


if __name__ == "__main__":
    {"cupy": cupy_check, "jax": jax_check}[sys.argv[1]]()

/*
 * Every function NVIDIA's libcudart.so.12 exports (sim/cudart_exports.h,
 * generated from sim/traces/cudart-12.9-exports.txt), so that a program
 * built against NVIDIA's runtime starts on the simulated one instead of
 * dying with "undefined symbol" when `cudaleak run --simulated` puts this
 * runtime first on its search path.
 *
 * Each is a weak definition that does nothing and returns
 * cudaErrorNotSupported (801): the simulation has no kernels, events or
 * textures. runtime.c's definitions are strong and take their place where
 * the simulation has something to do (allocations, frees, resets, entry
 * points, versions, device count, error strings, streams, stream capture
 * and graphs with memory nodes).
 *
 * A stub is declared `int f(void)`, whatever the real signature: on the
 * x86-64 and AArch64 calling conventions a caller's arguments are then
 * ignored and the return register read as the error code (or, for the few
 * functions returning a pointer or nothing, as NULL or ignored). The one
 * export that returns a structure, cudaCreateChannelDesc, is defined in
 * runtime.c.
 */
#include "cudart_exports.h"

#define SIMCUDART_NOT_SUPPORTED 801

#define STUB(name) \
    int name(void) __attribute__((weak)); \
    int name(void) { return SIMCUDART_NOT_SUPPORTED; }
SIMCUDART_EXPORTS(STUB)
#undef STUB

/*
 * A plugin that calls cudaDeviceReset, a runtime function cudaleak still
 * hooks, without linking libcudart: bound lazily, under cudaleak the call
 * reaches cudaleak's export, which finds no runtime to forward to.
 * plugin_leak() returns 100 + the call's error.
 */
#include "common.h"

int plugin_leak(void) { return 100 + cudaDeviceReset(); }

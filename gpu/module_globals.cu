// A module for the `graphs` section's module checks (scripts/gpu-validate.sh):
// built to a cubin (nvcc -cubin -arch=sm_90 -o globals.cubin module_globals.cu)
// and loaded at run time by gpu/graphs_resets.cu (modes module, module_loop).
// Its one device global is 1 MiB; graphs_resets.cu reads the size back with
// cuModuleGetGlobal and prints it as its ground truth.
__device__ char g[1 << 20];

extern "C" __global__ void touch_g() { g[threadIdx.x] = 1; }

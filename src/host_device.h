// LEANMOE_HOST_DEVICE marks a function that host code and CUDA kernels both call (one definition
// of a formula for the CPU backend, the reference and the GPU epilogues).
#pragma once

#if defined(__CUDACC__)
#define LEANMOE_HOST_DEVICE __host__ __device__
#else
#define LEANMOE_HOST_DEVICE
#endif

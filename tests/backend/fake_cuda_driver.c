// A stand-in CUDA driver (libcuda.so.1) for tests/backend/cuda_cudnn_graph_test.cpp on machines
// without a GPU. cuDNN's runtime-compiled engines (the fused attention ones among them) look up
// these entry points in libcuda before they answer even a deviceless heuristics query; this
// library lets that query run. It answers device queries like an H200 (sm_90, 132 SMs) and fails
// every launch: nothing is ever computed through it. Set STUB_LOG=1 to see which calls come.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define LOG(name) do { if (getenv("STUB_LOG")) fprintf(stderr, "[stub] %s\n", name); } while (0)
static char fake[64];
static char cubin[256];
typedef int CUresult;
CUresult cuInit(unsigned f) { LOG("cuInit"); return 0; }
CUresult cuDriverGetVersion(int* v) { LOG("cuDriverGetVersion"); *v = 13000; return 0; }
CUresult cuDeviceGetCount(int* n) { LOG("cuDeviceGetCount"); *n = 1; return 0; }
CUresult cuDeviceGet(int* d, int o) { LOG("cuDeviceGet"); *d = 0; return 0; }
CUresult cuDeviceGetAttribute(int* v, int a, int d) {
  int r = 0;
  switch (a) {
    case 75: r = 9; break; case 76: r = 0; break; case 16: r = 132; break; case 97: r = 232448; break;
    case 1: r = 1024; break; case 2: r = 1024; break; case 3: r = 64; break; case 4: r = 2147483647; break;
    case 5: case 6: r = 65535; break; case 8: r = 49152; break; case 10: r = 32; break; case 12: r = 65536; break;
    case 81: r = 233472; break; case 82: r = 65536; break; case 39: r = 2048; break; case 106: r = 32; break;
    case 13:
      r = 1980000;
      break;
    case 36:
      r = 3201000;
      break;
    case 38:
      r = 62914560;
      break;
    default: r = 1;
  }
  if (getenv("STUB_LOG")) fprintf(stderr, "[stub] cuDeviceGetAttribute(%d) -> %d\n", a, r);
  *v = r; return 0;
}
CUresult cuDevicePrimaryCtxRetain(void** c, int d) { LOG("cuDevicePrimaryCtxRetain"); *c = fake; return 0; }
CUresult cuDevicePrimaryCtxRelease(int d) { LOG("cuDevicePrimaryCtxRelease"); return 0; }
CUresult cuDevicePrimaryCtxReset(int d) { LOG("cuDevicePrimaryCtxReset"); return 0; }
CUresult cuCtxGetCurrent(void** c) { LOG("cuCtxGetCurrent"); *c = fake; return 0; }
CUresult cuCtxGetDevice(int* d) { LOG("cuCtxGetDevice"); *d = 0; return 0; }
CUresult cuCtxGetLimit(size_t* v, int l) { LOG("cuCtxGetLimit"); *v = 1024; return 0; }
CUresult cuCtxPopCurrent(void** c) { LOG("cuCtxPopCurrent"); if (c) *c = fake; return 0; }
CUresult cuCtxPushCurrent(void* c) { LOG("cuCtxPushCurrent"); return 0; }
static int func_attr(int a) {
  switch (a) { case 0: return 1024; case 1: return 0; case 2: return 0; case 3: return 0; case 4: return 168;
    case 5: return 90; case 6: return 90; case 8: return 232448; default: return 0; }
}
CUresult cuFuncGetAttribute(int* v, int a, void* f) { if (getenv("STUB_LOG")) fprintf(stderr, "[stub] cuFuncGetAttribute(%d)\n", a); *v = func_attr(a); return 0; }
CUresult cuFuncSetAttribute(void* f, int a, int v) { LOG("cuFuncSetAttribute"); return 0; }
CUresult cuKernelGetAttribute(int* v, int a, void* k, int d) { if (getenv("STUB_LOG")) fprintf(stderr, "[stub] cuKernelGetAttribute(%d)\n", a); *v = func_attr(a); return 0; }
CUresult cuKernelSetAttribute(int a, int v, void* k, int d) { LOG("cuKernelSetAttribute"); return 0; }
CUresult cuGetErrorName(int e, const char** s) { *s = "STUB"; return 0; }
CUresult cuGetErrorString(int e, const char** s) { *s = "stub driver"; return 0; }
CUresult cuLaunchCooperativeKernel() { LOG("cuLaunchCooperativeKernel"); return 1; }
CUresult cuLaunchKernel() { LOG("cuLaunchKernel"); return 1; }
CUresult cuLaunchKernelEx() { LOG("cuLaunchKernelEx"); return 1; }
CUresult cuLibraryGetKernel(void** k, void* l, const char* n) { LOG("cuLibraryGetKernel"); *k = fake; return 0; }
CUresult cuLibraryLoadData(void** l, const void* c, void* a, void* b, unsigned n, void* d, void* e, unsigned m) { LOG("cuLibraryLoadData"); *l = fake; return 0; }
CUresult cuLibraryLoadFromFile(void** l, const char* f, void* a, void* b, unsigned n, void* d, void* e, unsigned m) { LOG("cuLibraryLoadFromFile"); *l = fake; return 0; }
CUresult cuLibraryUnload(void* l) { return 0; }
CUresult cuLinkCreate(unsigned n, void* o, void** v, void** s) { LOG("cuLinkCreate"); *s = fake; return 0; }
CUresult cuLinkCreate_v2(unsigned n, void* o, void** v, void** s) { LOG("cuLinkCreate_v2"); *s = fake; return 0; }
CUresult cuLinkAddData(void* s, int t, void* d, size_t z, const char* n, unsigned k, void* o, void** v) { LOG("cuLinkAddData"); return 0; }
CUresult cuLinkAddData_v2(void* s, int t, void* d, size_t z, const char* n, unsigned k, void* o, void** v) { LOG("cuLinkAddData_v2"); return 0; }
CUresult cuLinkAddFile_v2(void* s, int t, const char* p, unsigned k, void* o, void** v) { LOG("cuLinkAddFile_v2"); return 0; }
CUresult cuLinkComplete(void* s, void** c, size_t* z) { LOG("cuLinkComplete"); *c = cubin; *z = sizeof cubin; return 0; }
CUresult cuLinkDestroy(void* s) { return 0; }
CUresult cuMemcpyDtoH_v2(void* d, unsigned long long s, size_t n) { LOG("cuMemcpyDtoH_v2"); memset(d, 0, n); return 0; }
CUresult cuModuleGetFunction(void** f, void* m, const char* n) { LOG("cuModuleGetFunction"); *f = fake; return 0; }
CUresult cuModuleGetGlobal_v2(unsigned long long* p, size_t* z, void* m, const char* n) { LOG("cuModuleGetGlobal_v2"); if (p) *p = 0; if (z) *z = 0; return 0; }
CUresult cuModuleLoadData(void** m, const void* i) { LOG("cuModuleLoadData"); *m = fake; return 0; }
CUresult cuModuleLoadDataEx(void** m, const void* i, unsigned n, void* o, void** v) { LOG("cuModuleLoadDataEx"); *m = fake; return 0; }
CUresult cuModuleLoadFatBinary(void** m, const void* i) { LOG("cuModuleLoadFatBinary"); *m = fake; return 0; }
CUresult cuModuleUnload(void* m) { return 0; }
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void* f, int b, size_t s) { LOG("cuOccupancy"); *n = 1; return 0; }
CUresult cuOccupancyMaxPotentialClusterSize(int* n, void* f, const void* c) { LOG("cuOccupancyCluster"); *n = 2; return 0; }
CUresult cuStreamGetCtx(void* s, void** c) { *c = fake; return 0; }
CUresult cuStreamSynchronize(void* s) { return 0; }
CUresult cuTensorMapEncodeTiled() { LOG("cuTensorMapEncodeTiled"); return 0; }

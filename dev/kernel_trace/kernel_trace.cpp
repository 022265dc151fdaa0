// Kernel times and the SM clock at the GPU's steady state, for any CUDA process, unchanged: a CUDA
// injection library (the driver loads CUDA_INJECTION64_PATH at cuInit and calls InitializeInjection,
// as Nsight does). It records every kernel's start and end (CUPTI concurrent-kernel activity, graph
// replays included) and samples the SM clock and the power draw (NVML, every KERNEL_TRACE_SAMPLE_MS,
// default 5) in CUPTI's timebase. Why: the layer runs at the 700 W power cap, where clocks fall to
// ~1.45-1.65 GHz; ncu times each kernel alone from idle at up to 1.98 GHz, so only a trace of the
// steady loop says which kernels of two layers differ where a training step runs them
// (README.md beside this file).
//
// At exit it writes KERNEL_TRACE_OUT (default /tmp/kernel_trace.%p.csv; %p: the process id), rows
//   n,id,name                                     (once per kernel: CUTLASS's names run to kilobytes)
//   k,start_ns,end_ns,stream,gridX,gridY,gridZ,blockX,id
//   s,t_ns,sm_mhz,power_mw
// read by summary.py. Build: see README.md (needs cupti.h and libcupti.so.13; NVML is opened with
// dlopen, the driver's libnvidia-ml.so.1).
#include <cupti.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t stream;
  int32_t grid[3], block;
  const char* name;  // CUPTI keeps one copy per kernel for the process's life
};
struct Sample {
  uint64_t t;
  unsigned sm_mhz, power_mw;
};

std::mutex g_mutex;
std::vector<KernelRecord> g_kernels;
std::vector<Sample> g_samples;
std::atomic<bool> g_stop{false};
std::thread g_sampler;
constexpr size_t kBufferBytes = 8u << 20;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<KernelRecord> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    got.push_back({k->start, k->end, k->streamId, {k->gridX, k->gridY, k->gridZ}, k->blockX, k->name});
  }
  std::free(buffer);
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_kernels.insert(g_kernels.end(), got.begin(), got.end());
}

// NVML's C ABI, the few calls used (no nvml.h needed; opened from the driver's library).
using NvmlDevice = void*;
struct Nvml {
  int (*init)() = nullptr;
  int (*handle)(unsigned, NvmlDevice*) = nullptr;
  int (*clock)(NvmlDevice, int, unsigned*) = nullptr;  // nvmlDeviceGetClockInfo, type 1 = NVML_CLOCK_SM
  int (*power)(NvmlDevice, unsigned*) = nullptr;        // nvmlDeviceGetPowerUsage, milliwatts
  NvmlDevice device = nullptr;
  bool open() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return false;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    handle = reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    clock = reinterpret_cast<int (*)(NvmlDevice, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<int (*)(NvmlDevice, unsigned*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    // The trace is of one GPU: index 0 of what the process sees (KERNEL_TRACE_NVML_INDEX to change).
    const char* index = std::getenv("KERNEL_TRACE_NVML_INDEX");
    return init && handle && clock && power && init() == 0 && handle(index ? std::atoi(index) : 0, &device) == 0;
  }
};

void sample_loop(Nvml nvml, int period_ms) {
  std::vector<Sample> local;
  while (!g_stop.load()) {
    Sample s{};
    cuptiGetTimestamp(&s.t);
    nvml.clock(nvml.device, 1, &s.sm_mhz);
    nvml.power(nvml.device, &s.power_mw);
    local.push_back(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
  }
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_samples = std::move(local);
}

void finish() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  g_stop = true;
  if (g_sampler.joinable()) g_sampler.join();
  std::string path = std::getenv("KERNEL_TRACE_OUT") ? std::getenv("KERNEL_TRACE_OUT") : "/tmp/kernel_trace.%p.csv";
  if (const size_t p = path.find("%p"); p != std::string::npos) path.replace(p, 2, std::to_string(getpid()));
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path.c_str());
    return;
  }
  const std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, int> ids;
  for (const KernelRecord& k : g_kernels) {
    const auto [it, added] = ids.emplace(k.name ? k.name : "?", int(ids.size()));
    if (added) std::fprintf(f, "n,%d,%s\n", it->second, it->first.c_str());
    std::fprintf(f, "k,%llu,%llu,%u,%d,%d,%d,%d,%d\n", (unsigned long long)k.start, (unsigned long long)k.end,
                 k.stream, k.grid[0], k.grid[1], k.grid[2], k.block, it->second);
  }
  for (const Sample& s : g_samples)
    std::fprintf(f, "s,%llu,%u,%u\n", (unsigned long long)s.t, s.sm_mhz, s.power_mw);
  std::fclose(f);
  std::fprintf(stderr, "kernel_trace: %zu kernels, %zu samples -> %s\n", g_kernels.size(), g_samples.size(),
               path.c_str());
}

}  // namespace

extern "C" int InitializeInjection() {
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  // Buffers delivered every 500 ms as well: what the process's own CUDA teardown at exit (which may
  // run before finish()) would leave unflushed is then at most the last half second.
  check(cuptiActivityFlushPeriod(500), "cuptiActivityFlushPeriod");
  Nvml nvml;
  if (nvml.open()) {
    const char* ms = std::getenv("KERNEL_TRACE_SAMPLE_MS");
    g_sampler = std::thread(sample_loop, nvml, ms ? std::max(1, std::atoi(ms)) : 5);
  } else {
    std::fprintf(stderr, "kernel_trace: NVML not available: no clock samples\n");
  }
  std::atexit(finish);
  return 1;
}

// NcclCommunicator: the production Communicator, on an existing ncclComm_t the caller created
// (ncclCommInitRank, or torch.distributed's). Compiled with NCCL only when CMake found nccl.h and
// libnccl (LEANMOE_WITH_NCCL); otherwise make_nccl_communicator throws. Between GPUs never run so
// far (P = 1 in tests/gpu/test_ep_gpu.cpp): see docs/ep.md.
#include "leanmoe/ep.h"

#if defined(LEANMOE_WITH_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace leanmoe::ep {

#if defined(LEANMOE_WITH_NCCL)
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("nccl communicator: ") + what + " failed: " + ncclGetErrorString(r));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, int device_index, Stream stream, bool owning = false)
      : comm_(comm), rank_(rank), size_(size), device_index_(device_index), stream_(stream), owning_(owning) {}
  // Owning (make_nccl_communicators): the comm and the stream were created for this communicator.
  ~NcclCommunicator() override {
    if (!owning_) return;
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_index_);
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    ncclCommDestroy(comm_);
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    cudaSetDevice(previous);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda; }
  Stream stream() const override { return stream_; }
  void synchronize() override {
    const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    if (e != cudaSuccess) throw Error(std::string("nccl communicator: stream sync failed: ") + cudaGetErrorString(e));
  }

  // Bytes as ncclUint8 (ncclInt8's unsigned twin) so any element size travels; zero-count peers are
  // skipped, and the grouped calls let NCCL run all pairs concurrently without deadlock.
  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) override {
    auto s = static_cast<cudaStream_t>(stream_);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      if (send_counts[p] > 0)
        check_nccl(ncclSend(static_cast<const char*>(send) + send_offsets[p] * elem_bytes, send_counts[p] * elem_bytes,
                            ncclUint8, p, comm_, s),
                   "ncclSend");
      if (recv_counts[p] > 0)
        check_nccl(ncclRecv(static_cast<char*>(recv) + recv_offsets[p] * elem_bytes, recv_counts[p] * elem_bytes,
                            ncclUint8, p, comm_, s),
                   "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  void all_reduce_sum(float* data, int64_t count) override {
    check_nccl(ncclAllReduce(data, data, size_t(count), ncclFloat32, ncclSum, comm_, static_cast<cudaStream_t>(stream_)),
               "ncclAllReduce");
  }

 private:
  ncclComm_t comm_;
  int rank_, size_, device_index_;
  Stream stream_;
  bool owning_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(void* nccl_comm, int rank, int size, int device_index,
                                                     Stream stream) {
  if (!nccl_comm) throw Error("make_nccl_communicator: argument 'nccl_comm': must not be null");
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("make_nccl_communicator: argument 'rank': must be in [0, size), got rank " + std::to_string(rank) +
                " size " + std::to_string(size));
  return std::make_unique<NcclCommunicator>(static_cast<ncclComm_t>(nccl_comm), rank, size, device_index, stream);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices) {
  const int P = int(devices.size());
  if (P < 1) throw Error("make_nccl_communicators: argument 'devices': needs at least one device");
  std::vector<ncclComm_t> comms(P);
  check_nccl(ncclCommInitAll(comms.data(), P, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  int previous = 0;
  cudaGetDevice(&previous);
  for (int r = 0; r < P; ++r) {
    cudaStream_t stream = nullptr;
    cudaError_t e = cudaSetDevice(devices[r]);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      for (int q = r; q < P; ++q) ncclCommDestroy(comms[q]);  // out[0..r) destroy their own
      cudaSetDevice(previous);
      throw Error(std::string("make_nccl_communicators: argument 'devices': stream on device ") +
                  std::to_string(devices[r]) + " failed: " + cudaGetErrorString(e));
    }
    out.push_back(std::make_unique<NcclCommunicator>(comms[r], r, P, devices[r], stream, true));
  }
  cudaSetDevice(previous);
  return out;
}

#else

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(void*, int, int, int, Stream) {
  throw Error("make_nccl_communicator: argument 'nccl_comm': this leanmoe was built without NCCL "
              "(needs the CUDA backend and nccl.h/libnccl at configure time)");
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(const std::vector<int>&) {
  throw Error("make_nccl_communicators: argument 'devices': this leanmoe was built without NCCL "
              "(needs the CUDA backend and nccl.h/libnccl at configure time)");
}

#endif

}  // namespace leanmoe::ep

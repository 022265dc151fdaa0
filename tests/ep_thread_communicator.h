// ThreadCommunicator: P ranks as P threads of one process, for the CPU tests of expert
// parallelism. Test infrastructure only, not a transport for users (production uses NCCL:
// make_nccl_communicator); tools/bench_ep.cpp includes it too, for its CPU runs (CMake adds tests/
// to that tool's include path). Each collective publishes this rank's pointers in a shared slot,
// meets the other ranks at a barrier, reads its peers' data, and meets them again so no rank
// reuses a buffer a peer is still reading.
#pragma once
#include <barrier>
#include <cstring>
#include <functional>
#include <thread>
#include <type_traits>
#include <vector>

#include "leanmoe/ep.h"

namespace leanmoe::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), slots_(size), barrier_(size) {}
  int size() const { return size_; }

  struct Slot {
    const void* send = nullptr;
    const int64_t* send_counts = nullptr;
    const int64_t* send_offsets = nullptr;
    const float* values = nullptr;
  };
  Slot& slot(int rank) { return slots_[rank]; }
  void arrive_and_wait() { barrier_.arrive_and_wait(); }

 private:
  int size_;
  std::vector<Slot> slots_;
  std::barrier<> barrier_;
};

class ThreadCommunicator final : public ep::Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  Device device() const override { return Device::cpu; }
  Stream stream() const override { return nullptr; }
  void synchronize() override {}

  void all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_offsets, void* recv,
                    const int64_t* recv_counts, const int64_t* recv_offsets, size_t elem_bytes) override {
    group_.slot(rank_) = {send, send_counts, send_offsets, nullptr};
    group_.arrive_and_wait();
    std::string mismatch;
    for (int p = 0; p < size(); ++p) {
      const ThreadGroup::Slot& peer = group_.slot(p);
      if (peer.send_counts[rank_] != recv_counts[p]) {
        mismatch = "ThreadCommunicator: argument 'recv_counts': rank " + std::to_string(rank_) + " expects " +
                   std::to_string(recv_counts[p]) + " elements from rank " + std::to_string(p) + ", which sends " +
                   std::to_string(peer.send_counts[rank_]);
        break;
      }
      if (recv_counts[p] > 0)
        std::memcpy(static_cast<char*>(recv) + recv_offsets[p] * elem_bytes,
                    static_cast<const char*>(peer.send) + peer.send_offsets[rank_] * elem_bytes,
                    size_t(recv_counts[p]) * elem_bytes);
    }
    group_.arrive_and_wait();
    if (!mismatch.empty()) throw Error(mismatch);
  }

  // Summed in rank order on every rank, so every rank gets the same bits.
  void all_reduce_sum(float* data, int64_t count) override {
    group_.slot(rank_) = {nullptr, nullptr, nullptr, data};
    group_.arrive_and_wait();
    std::vector<float> sum(count, 0.f);
    for (int p = 0; p < size(); ++p)
      for (int64_t i = 0; i < count; ++i) sum[i] += group_.slot(p).values[i];
    group_.arrive_and_wait();
    std::memcpy(data, sum.data(), size_t(count) * sizeof(float));
  }

 private:
  ThreadGroup& group_;
  int rank_;
};

// Runs body(comm) on `size` threads, one rank each; rethrows the first failure. Comm is any
// communicator constructible from (ThreadGroup&, rank): ThreadCommunicator here, the GPU tests'
// device-memory one in tests/gpu/test_ep_gpu.cpp.
template <class Comm = ThreadCommunicator>
void run_ranks(int size, const std::type_identity_t<std::function<void(Comm&)>>& body) {
  ThreadGroup group(size);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      Comm comm(group, r);
      try {
        body(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace leanmoe::testing

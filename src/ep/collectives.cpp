// Small collectives built on the Communicator interface (include/leanmoe/ep.h).
#include <cmath>

#include "leanmoe/ep.h"

namespace leanmoe::ep {

std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send) {
  const int P = comm.size();
  if (int64_t(send.size()) != P)
    throw Error("exchange_counts: argument 'send': needs one count per rank (" + std::to_string(P) + "), got " +
                std::to_string(send.size()));
  std::vector<int64_t> ones(P, 1), offsets(P), recv(P);
  for (int p = 0; p < P; ++p) offsets[p] = p;
  const size_t bytes = P * sizeof(int64_t);
  if (comm.device() == Device::cpu) {
    comm.all_to_all_v(send.data(), ones.data(), offsets.data(), recv.data(), ones.data(), offsets.data(),
                      sizeof(int64_t));
    return recv;
  }
  // Device communicators (NCCL) move device memory only: stage the P counts through the device.
  Buffer dev_send(comm.device(), bytes), dev_recv(comm.device(), bytes);
  copy_to_device(comm.device(), dev_send.data(), send.data(), bytes);
  comm.all_to_all_v(dev_send.data(), ones.data(), offsets.data(), dev_recv.data(), ones.data(), offsets.data(),
                    sizeof(int64_t));
  comm.synchronize();
  copy_to_host(comm.device(), recv.data(), dev_recv.data(), bytes);
  return recv;
}

float global_grad_norm(float local_sum_of_squares, Communicator& comm) {
  float total = local_sum_of_squares;
  if (comm.device() == Device::cpu) {
    comm.all_reduce_sum(&total, 1);
  } else {
    Buffer dev(comm.device(), sizeof(float));
    copy_to_device(comm.device(), dev.data(), &total, sizeof(float));
    comm.all_reduce_sum(static_cast<float*>(dev.data()), 1);
    comm.synchronize();
    copy_to_host(comm.device(), &total, dev.data(), sizeof(float));
  }
  return std::sqrt(total);
}

}  // namespace leanmoe::ep

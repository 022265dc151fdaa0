// A reference::LayerLauncher that captures the layer (forward + backward) into one CUDA graph on
// `stream` in global capture mode, where any host-synchronising call (a device-to-host copy, a
// stream, event or device synchronise, cudaMalloc) invalidates the capture, then launches it once
// and waits for it. Shared by the GPU tests that hold the layer to "no host synchronisation".
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "naive_moe.h"

namespace leanmoe::testing {

inline reference::LayerLauncher graph_launcher(cudaStream_t stream) {
  return [stream](const std::function<void()>& enqueue_layer) {
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    std::string thrown;
    try {
      enqueue_layer();
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);  // ends the capture whatever happened
    ASSERT_EQ(thrown, "") << "the layer failed under stream capture";
    ASSERT_EQ(ended, cudaSuccess) << "capture invalidated (a host-synchronising call?): " << cudaGetErrorString(ended);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  };
}

}  // namespace leanmoe::testing

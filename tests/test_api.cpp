#include <gtest/gtest.h>

#include "leanmoe/leanmoe.h"

using namespace leanmoe;

TEST(Api, ContiguousTensorStrides) {
  float buf[24];
  Tensor t = Tensor::contiguous(buf, DType::f32, Device::cpu, {2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_TRUE(t.is_contiguous());
  t.stride[2] = 2;
  EXPECT_FALSE(t.is_contiguous());
}

TEST(Api, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
}

// Expert FLOPs follow the up-projection's width W = up_width(cfg): 2*T*K*d*(W + n) forward and twice
// that backward, so 6/12*T*K*d*n for gated experts and 4/8*T*K*d*n for plain ones (n rows, not 2n).
TEST(Api, FlopsFollowTheActivationsWidth) {
  MoEConfig cfg;
  cfg.d = 64, cfg.n = 32, cfg.E = 8, cfg.K = 2;
  const double tkdn = 10.0 * 2 * 64 * 32;
  EXPECT_EQ(forward_flops(cfg, 10), 6 * tkdn);
  EXPECT_EQ(backward_flops(cfg, 10), 12 * tkdn);
  cfg.activation = Activation::relu2;
  EXPECT_EQ(forward_flops(cfg, 10), 4 * tkdn);
  EXPECT_EQ(backward_flops(cfg, 10), 8 * tkdn);
}

// The CPU backend's GEMM (src/cpu/experts.h): row-major C = op(A)·op(B) split across OpenMP threads
// by rows or columns of C, each slice one single-threaded OpenBLAS call (issue 14). Checked against
// a double-precision loop for every transpose pair, both split directions and shapes whose extent
// does not divide by the thread count; and the BLAS thread policy.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cmath>
#include <random>
#include <vector>

#include "../src/cpu/experts.h"  // internal header: tests reach it by path

namespace leanmoe::cpu {
namespace {

std::vector<float> random_matrix(int64_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = dist(gen);
  return v;
}

// C[M, N] = op(A) op(B) in double; A is [M, K] (or [K, M] transposed), B is [K, N] (or [N, K]).
std::vector<double> reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                              const std::vector<float>& B) {
  std::vector<double> C(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += double(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = s;
    }
  return C;
}

TEST(CpuGemm, SplitSlicesMatchTheWholeProduct) {
  // 2^18 multiply-adds and more take the split path; M >= N splits rows, M < N columns; odd extents
  // leave unequal slices. Tolerance: K <= 300 fp32 products summed, relative error ~ sqrt(K)*2^-24
  // per element on values of magnitude sqrt(K); 1e-5 of the largest |C| leaves a wide margin while a
  // misplaced slice (wrong offset or leading dimension) is O(1).
  struct Shape {
    int64_t M, N, K;
  };
  uint32_t seed = 1;
  for (Shape s : {Shape{517, 64, 33}, Shape{48, 1031, 19}, Shape{300, 300, 300}, Shape{7, 9, 5}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + " ta " +
                     std::to_string(ta) + " tb " + std::to_string(tb));
        const std::vector<float> A = random_matrix(s.M * s.K, seed++), B = random_matrix(s.K * s.N, seed++);
        std::vector<float> C(size_t(s.M * s.N), NAN);
        gemm(ta, tb, s.M, s.N, s.K, A.data(), B.data(), C.data());
        const std::vector<double> want = reference(ta, tb, s.M, s.N, s.K, A, B);
        double scale = 0, err = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          scale = std::max(scale, std::abs(want[i]));
          err = std::max(err, std::abs(double(C[i]) - want[i]));  // NaN (an unwritten element) fails below
        }
        EXPECT_LE(err, 1e-5 * scale);
        for (float c : C) ASSERT_TRUE(std::isfinite(c)) << "an element of C was not written";
      }
}

// One level of parallelism: a pthreads OpenBLAS is left at one thread after leanmoe's GEMMs (its own
// pool would spin against OpenMP's). An OpenMP-built or serial OpenBLAS is left alone.
TEST(CpuGemm, PthreadsOpenBlasRunsSingleThreaded) {
  const std::vector<float> A = random_matrix(64 * 64, 1), B = random_matrix(64 * 64, 2);
  std::vector<float> C(64 * 64);
  gemm(false, false, 64, 64, 64, A.data(), B.data(), C.data());
  if (openblas_get_parallel() != 1)
    GTEST_SKIP() << "not a pthreads OpenBLAS (parallel = " << openblas_get_parallel() << ")";
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

}  // namespace
}  // namespace leanmoe::cpu

// Mixed precision on device tensors (include/ddp/tensor/precision.hpp) on Thrust's CPU system: rounding to tf32,
// bf16 and fp16; GEMMs and convolutions under an autocast scope against references computed in double from the
// rounded operands; the scope's nesting and threads; and training in bf16 and fp16 (with GradScaler) under DDP at
// world sizes 1, 2 and 4: N ranks equal one process, the master weights stay float, an fp16 overflow skips the
// step on every rank alike. nvcc builds it too, without the DDP parts (//test/tensor:precision_cuda_test, on a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/tensor/precision.hpp"
#include "test/parallel/ddp_device_cases.hpp"

namespace precision_test {

using namespace ddp;
using Dev = DeviceSpace;

inline std::vector<float> random_values(std::size_t n, std::uint64_t seed, float lo = -2, float hi = 2) {
  Generator g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = g.uniform(lo, hi);
  return v;
}

inline Tensor<float, Dev> device(std::vector<float> const& v, Shape s) {
  Tensor<float> t(s);
  for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<std::int64_t>(i)] = v[i];
  return to_space<Dev>(t);
}

inline std::vector<float> host(Tensor<float, Dev> const& t) {
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  Kernels<Dev>::to_host(t.numel(), t.data(), v.data());
  return v;
}

// C = A(M×K) B(K×N) in double from operands rounded to p.
inline std::vector<double> reference_gemm(Precision p, std::vector<float> const& a, std::vector<float> const& b,
                                          std::int64_t M, std::int64_t N, std::int64_t K) {
  std::vector<double> c(static_cast<std::size_t>(M * N), 0.0);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k)
        s += double(round_to(p, a[static_cast<std::size_t>(i * K + k)])) *
             double(round_to(p, b[static_cast<std::size_t>(k * N + j)]));
      c[static_cast<std::size_t>(i * N + j)] = s;
    }
  return c;
}

inline double max_rel(std::vector<float> const& got, std::vector<double> const& want) {
  double worst = 0, scale = 1;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]) / scale);
  return worst;
}

}  // namespace precision_test

TEST_CASE("precision: rounding to tf32, bf16 and fp16, ties to even") {
  using ddp::Precision;
  using ddp::round_to;
  float const one_plus = 1.0f + 0x1p-9f;  // between bf16 neighbours 1 and 1 + 2^-7, nearer 1
  CHECK(round_to(Precision::kBf16, one_plus) == 1.0f);
  CHECK(round_to(Precision::kBf16, 1.0f + 0x1p-8f) == 1.0f);                // a tie: to even (1)
  CHECK(round_to(Precision::kBf16, 1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);  // a tie: to even (up)
  CHECK(round_to(Precision::kTf32, 1.0f + 0x1p-12f) == 1.0f);               // tf32: 10 mantissa bits
  CHECK(round_to(Precision::kTf32, 1.0f + 0x1p-10f) == 1.0f + 0x1p-10f);
  CHECK(round_to(Precision::kFp16, 70000.0f) == std::numeric_limits<float>::infinity());  // past 65504
  CHECK(round_to(Precision::kFp16, 1.0f + 0x1p-11f) == 1.0f);
  CHECK(round_to(Precision::kFp32, one_plus) == one_plus);
  CHECK(std::isnan(round_to(Precision::kTf32, std::numeric_limits<float>::quiet_NaN())));
  CHECK(round_to(Precision::kTf32, std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(ddp::parse_precision("bf16") == Precision::kBf16);
  CHECK_THROWS_WITH_AS(ddp::parse_precision("fp8"), doctest::Contains("'fp8' is not one of fp32, tf32, bf16, fp16"),
                       ddp::ArgumentError);
}

TEST_CASE("precision: an autocast scope sets this thread's precision, nests, and ends") {
  using ddp::Precision;
  CHECK(ddp::matmul_precision() == Precision::kFp32);
  {
    ddp::autocast outer(Precision::kBf16);
    CHECK(ddp::matmul_precision() == Precision::kBf16);
    {
      ddp::autocast inner(Precision::kFp16);
      CHECK(ddp::matmul_precision() == Precision::kFp16);
    }
    CHECK(ddp::matmul_precision() == Precision::kBf16);
    Precision other = Precision::kTf32;
    std::thread([&] { other = ddp::matmul_precision(); }).join();
    CHECK(other == Precision::kFp32);  // per thread
  }
  CHECK(ddp::matmul_precision() == Precision::kFp32);
}

TEST_CASE("precision: device GEMMs take their operands in the scope's precision and accumulate in float") {
  using namespace precision_test;
  std::int64_t const M = 7, N = 9, K = 33;
  auto const a = random_values(static_cast<std::size_t>(M * K), 1),
             b = random_values(static_cast<std::size_t>(K * N), 2);
  auto const A = device(a, Shape{M, K}), B = device(b, Shape{K, N});
  auto run = [&](Precision p) {
    Tensor<float, Dev> C(Shape{M, N});
    autocast guard(p);
    Kernels<Dev>::gemm(Trans::kNo, Trans::kNo, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
    return host(C);
  };
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16, Precision::kFp16}) {
    CAPTURE(name(p));
    auto const got = run(p);
    CHECK(max_rel(got, reference_gemm(p, a, b, M, N, K)) < 1e-6);  // float sums of exact products
    if (p != Precision::kFp32)  // and not the float GEMM's result: the operands did round
      CHECK(max_rel(got, reference_gemm(Precision::kFp32, a, b, M, N, K)) > 1e-5);
  }
}

TEST_CASE("precision: device convolutions round their operands, forward and backward") {
  using namespace precision_test;
  ConvGeometry const g{.N = 2, .C = 3, .H = 6, .W = 6, .O = 4, .k = 3, .stride = 1, .pad = 1};
  auto const x = random_values(static_cast<std::size_t>(g.N * g.C * g.H * g.W), 3);
  auto const w = random_values(static_cast<std::size_t>(g.O * g.patch()), 4);
  auto const gy = random_values(static_cast<std::size_t>(g.N * g.O * g.L()), 5);
  auto rounded = [](std::vector<float> v, Precision p) {
    for (auto& e : v) e = round_to(p, e);
    return v;
  };
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    CAPTURE(name(p));
    Tensor<float, Dev> y(Shape{g.N, g.O, g.OH(), g.OW()}), y_ref(y.shape());
    Tensor<float, Dev> gx(Shape{g.N, g.C, g.H, g.W}), gx_ref(gx.shape()), gw(Shape{g.O, g.C, g.k, g.k}),
        gw_ref(gw.shape());
    auto const X = device(x, gx.shape()), W = device(w, gw.shape()), GY = device(gy, y.shape());
    auto const Xr = device(rounded(x, p), gx.shape()), Wr = device(rounded(w, p), gw.shape()),
               GYr = device(rounded(gy, p), y.shape());
    {
      autocast guard(p);
      Kernels<Dev>::conv2d_fwd(g, X.data(), W.data(), static_cast<float const*>(nullptr), y.data());
      Kernels<Dev>::conv2d_bwd(g, X.data(), W.data(), y.data(), GY.data(), 0.0f, gx.data(), 0.0f, gw.data(), 0.0f,
                               static_cast<float*>(nullptr));
    }
    Kernels<Dev>::conv2d_fwd(g, Xr.data(), Wr.data(), static_cast<float const*>(nullptr), y_ref.data());
    Kernels<Dev>::conv2d_bwd(g, Xr.data(), Wr.data(), y_ref.data(), GYr.data(), 0.0f, gx_ref.data(), 0.0f,
                             gw_ref.data(), 0.0f, static_cast<float*>(nullptr));
    CHECK(host(y) == host(y_ref));  // the float kernel on the rounded operands, bitwise
    CHECK(host(gx) == host(gx_ref));
    CHECK(host(gw) == host(gw_ref));
  }
}

TEST_CASE("precision: bf16 and fp16 training under DDP: N ranks equal one process, master weights stay float") {
  using namespace precision_test;
  std::int64_t const B = 16;
  int const steps = 4;
  auto const data = test::make_data(B * steps, 8, 4, 91);
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    CAPTURE(name(p));
    // One process on the whole batch, in precision p and in float.
    auto one_process = [&](Precision q) {
      auto m = test::device::make_mlp<Dev>(8, 32, 4, 1);
      nn::ParameterArena<float, Dev> arena(m);
      optim::basic_sgd<float, Dev> opt(arena, {.lr = 0.05, .momentum = 0.9});
      for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        autocast guard(q);
        backward(mse_loss(m(Variable<float, Dev>(to_space<Dev>(test::rows(data.x, s * B, B)))),
                          to_space<Dev>(test::rows(data.y, s * B, B))));
        opt.step();
      }
      return test::device::weights(arena);
    };
    auto const reference = one_process(p), in_float = one_process(Precision::kFp32);
    CHECK(test::device::rel_diff(reference, in_float) > 1e-6);  // the precision changed the run
    CHECK(test::device::rel_diff(reference, in_float) < 2e-2);  // and not by much
    // Master weights: float values that no bf16/fp16 holds.
    std::size_t not_representable = 0;
    for (float v : reference) not_representable += round_to(p, v) != v;
    CHECK(not_representable > reference.size() / 2);
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA  // ThreadsBackend takes device memory the host can touch only
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
      spawn(n, [&](ThreadsBackend& comm) {
        autocast guard(p);  // each rank's thread chooses its own precision
        got[static_cast<std::size_t>(comm.rank())] = test::device::device_ddp(comm, data, B, steps);
      });
      for (auto const& w : got) CHECK(test::device::rel_diff(w, reference) < 1e-5);
    }
#endif
  }
}

// On CUDA (the nvcc build, //test/tensor:precision_cuda_test) the cases above run without their DDP part: DDP over
// GPU tensors is NCCL's (//test/parallel:ddp_nccl_gpu_np*_test), and ThreadsBackend cannot take CUDA memory.
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_CUDA
TEST_CASE("precision: an fp16 overflow under GradScaler skips the step on every rank and backs the scale off") {
  using namespace precision_test;
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto m = test::device::make_mlp<Dev>(8, 32, 4, 1);
      DistributedDataParallel<decltype(m), ThreadsBackend> ddp(m, comm);
      optim::basic_adamw<float, Dev> opt(ddp.parameters(), {.lr = 1e-2});
      optim::basic_grad_scaler<float, Dev> scaler(ddp.parameters(), {.init_scale = 1024.0});
      auto const before = test::device::weights(ddp.parameters());
      // Rank 0's input overflows fp16 (1e5 > 65504): its GEMM makes Inf, so do the reduced gradients everywhere.
      Tensor<float> x(Shape{4, 8}), y(Shape{4, 4});
      for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = comm.rank() == 0 && i == 3 ? 1e5f : 0.5f;
      for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = 0.25f;
      opt.zero_grad();
      {
        autocast guard(Precision::kFp16);
        backward(scaler.scale(mse_loss(ddp(Variable<float, Dev>(to_space<Dev>(x))), to_space<Dev>(y))));
      }
      bool const stepped = scaler.step(opt);
      CHECK_FALSE(stepped);
      CHECK(scaler.get_scale() == 512.0);
      CHECK(scaler.skipped_steps() == 1);
      CHECK(test::device::weights(ddp.parameters()) == before);  // the master weights did not move
    });
  }
}
#endif

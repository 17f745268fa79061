// Every op on device tensors (Thrust's CPU system): the central-difference gradient check in double, and the
// forward values and gradients against the same op on host tensors. The ops are the host ones, unchanged: each
// case is one generic lambda run over Variable<double, HostSpace> and Variable<double, DeviceSpace>.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "ddp/tensor/device.hpp"
#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

using VarDev = Variable<double, DeviceSpace>;

template <class V>
using space_of = typename std::decay_t<V>::space;

// The host tensor, or its device copy, for the space of the variables an op is running on.
template <class T>
struct Both {
  Tensor<T> host;
  Tensor<T, DeviceSpace> device;
  explicit Both(Tensor<T> h) : host(std::move(h)), device(to_space<DeviceSpace>(host)) {}
  template <MemorySpace S>
  Tensor<T, S> const& in() const {
    if constexpr (std::same_as<S, HostSpace>)
      return host;
    else
      return device;
  }
};

template <MemorySpace S>
std::vector<double> host_values(Tensor<double, S> const& t) {
  std::vector<double> v(static_cast<std::size_t>(t.numel()));
  Kernels<S>::to_host(t.numel(), t.data(), v.data());
  return v;
}

// An undefined variable of v's type and space (layer_norm without a weight or a bias).
template <class V>
std::decay_t<V> none(V const&) {
  return {};
}

double max_rel_diff(std::vector<double> const& a, std::vector<double> const& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]) / std::max(1.0, std::abs(a[i])));
  return m;
}

// The op `f` (generic over the variables' space) on device inputs: gradient check, and values and gradients
// equal to the host run's to 1e-12. `trainable[i]` says whether input i requires grad.
template <class F>
void check_device(std::string const& label, F f, std::vector<Tensor<double>> const& values,
                  std::vector<bool> trainable = {}) {
  INFO(label);
  std::vector<VarD> hin;
  std::vector<VarDev> din;
  for (std::size_t i = 0; i < values.size(); ++i) {
    RequiresGrad const rg = trainable.empty() || trainable[i] ? RequiresGrad::kYes : RequiresGrad::kNo;
    hin.emplace_back(clone(values[i]), rg);
    din.emplace_back(to_space<DeviceSpace>(values[i]), rg);
  }
  GradCheckResult const r = grad_check(f, din);
  CHECK_MESSAGE(r.ok, r.summary());
  CHECK(r.elements_checked > 0);

  // Host and device runs of the same backward, seeded with the same cotangent.
  for (auto const& x : hin) x.zero_grad();
  for (auto const& x : din) x.zero_grad();
  VarD const hy = f(hin);
  VarDev const dy = f(din);
  CHECK(max_rel_diff(host_values(hy.value()), host_values(dy.value())) < 1e-12);
  Generator g(7);
  Tensor<double> v(hy.shape());
  for (std::int64_t i = 0; i < v.numel(); ++i) v[i] = g.uniform(-1.0, 1.0);
  backward(hy, v);
  backward(dy, to_space<DeviceSpace>(v));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!hin[i].requires_grad()) continue;
    REQUIRE(hin[i].has_grad() == din[i].has_grad());
    if (hin[i].has_grad())
      CHECK_MESSAGE(max_rel_diff(host_values(hin[i].grad()), host_values(din[i].grad())) < 1e-12, "input " << i);
  }
}

}  // namespace

TEST_CASE("device: matmul, linear and linear_residual (with and without bias, 2-D and 3-D input)") {
  Generator gen(1);
  check_device("matmul", [](auto const& in) { return matmul(in[0], in[1]); },
               {uniform({3, 4}, gen), uniform({4, 5}, gen)});
  check_device("matmul, b constant", [](auto const& in) { return matmul(in[0], in[1]); },
               {uniform({3, 4}, gen), uniform({4, 5}, gen)}, {true, false});
  check_device("linear+bias", [](auto const& in) { return linear(in[0], in[1], in[2]); },
               {uniform({2, 3, 4}, gen), uniform({5, 4}, gen), uniform({5}, gen)});
  check_device("linear", [](auto const& in) { return linear(in[0], in[1]); },
               {uniform({6, 4}, gen), uniform({3, 4}, gen)});
  check_device("linear_residual+bias, r interior",
               [](auto const& in) { return linear_residual(tanh(in[0]), in[1], in[2], in[3]); },
               {uniform({2, 3, 5}, gen), uniform({2, 3, 4}, gen), uniform({5, 4}, gen), uniform({5}, gen)});
  check_device("linear_residual", [](auto const& in) { return linear_residual(in[0], in[1], in[2]); },
               {uniform({6, 3}, gen), uniform({6, 4}, gen), uniform({3, 4}, gen)});
}

TEST_CASE("device: add, sub (same shape, trailing-dims and scalar broadcast), mul, scale") {
  Generator gen(2);
  for (Shape bs : {Shape{3, 4}, Shape{4}, Shape{1}}) {
    std::string const s = detail::cat(" b ", bs);
    check_device("add" + s, [](auto const& in) { return add(in[0], in[1]); }, {uniform({3, 4}, gen), uniform(bs, gen)});
    check_device("sub" + s, [](auto const& in) { return sub(in[0], in[1]); }, {uniform({3, 4}, gen), uniform(bs, gen)});
  }
  check_device("add(x, x)", [](auto const& in) { return add(in[0], in[0]); }, {uniform({5}, gen)});
  check_device("mul", [](auto const& in) { return mul(in[0], in[1]); }, {uniform({2, 5}, gen), uniform({2, 5}, gen)});
  check_device("scale", [](auto const& in) { return scale(in[0], 0.75); }, {uniform({7}, gen)});
}

TEST_CASE("device: relu (off the kink), tanh, sigmoid") {
  Generator gen(3);
  check_device("relu", [](auto const& in) { return relu(in[0]); }, {away_from_zero({4, 6}, gen)});
  check_device("tanh", [](auto const& in) { return tanh(in[0]); }, {uniform({4, 6}, gen)});
  check_device("sigmoid", [](auto const& in) { return sigmoid(in[0]); }, {uniform({4, 6}, gen)});
}

TEST_CASE("device: sum, mean, reshape, flatten (and a reshape of an interior value)") {
  Generator gen(4);
  check_device("sum", [](auto const& in) { return sum(in[0]); }, {uniform({3, 5}, gen)});
  check_device("mean", [](auto const& in) { return mean(in[0]); }, {uniform({3, 5}, gen)});
  check_device("reshape", [](auto const& in) { return reshape(in[0], Shape{5, 3}); }, {uniform({3, 5}, gen)});
  check_device("flatten", [](auto const& in) { return flatten(in[0]); }, {uniform({2, 3, 2, 2}, gen)});
  check_device("tanh(reshape(x·2))", [](auto const& in) { return tanh(reshape(scale(in[0], 2.0), Shape{15})); },
               {uniform({3, 5}, gen)});
}

TEST_CASE("device: log_softmax, mse_loss, cross_entropy, nll_loss") {
  Generator gen(5);
  check_device("log_softmax", [](auto const& in) { return log_softmax(in[0]); }, {uniform({4, 6}, gen, -3, 3)});
  Both<double> const target(uniform({4, 6}, gen));
  check_device("mse_loss", [&](auto const& in) { return mse_loss(in[0], target.in<space_of<decltype(in[0])>>()); },
               {uniform({4, 6}, gen)});
  Both<std::int32_t> const ids(random_targets(5, 7, gen));
  check_device("cross_entropy",
               [&](auto const& in) { return cross_entropy(in[0], ids.in<space_of<decltype(in[0])>>()); },
               {uniform({5, 7}, gen, -3, 3)});
  check_device("nll_loss(log_softmax)",
               [&](auto const& in) { return nll_loss(log_softmax(in[0]), ids.in<space_of<decltype(in[0])>>()); },
               {uniform({5, 7}, gen, -3, 3)});
}

// Found by the loss kernel and reported at the next host read (device_errors.hpp): here, reading the loss.
TEST_CASE("device: a class id outside [0, C) is an error on device targets too") {
  Generator gen(6);
  Tensor<std::int32_t> bad = random_targets(3, 4, gen);
  bad[1] = 4;
  VarDev x(to_space<DeviceSpace>(uniform({3, 4}, gen)), RequiresGrad::kYes);
  check_throws_with<ArgumentError>([&] { (void)cross_entropy(x, to_space<DeviceSpace>(bad)).item(); },
                                   {"target 4", "row 1"});
}

TEST_CASE("device: conv2d (strides, padding, no bias), conv2d+relu, conv2d+relu+max_pool2d (Winograd, fused)") {
  Generator gen(7);
  struct Case {
    std::int64_t N, C, H, W, O, k, stride, pad;
  };
  for (Case c : {Case{2, 3, 6, 5, 2, 3, 1, 1}, Case{1, 2, 7, 7, 3, 3, 2, 0}, Case{2, 1, 5, 6, 2, 2, 2, 1}}) {
    Conv2dArgs const args{.stride = c.stride, .padding = c.pad};
    std::string const s = detail::cat(" k", c.k, " s", c.stride, " p", c.pad);
    check_device("conv2d" + s, [args](auto const& in) { return conv2d(in[0], in[1], in[2], args); },
                 {uniform({c.N, c.C, c.H, c.W}, gen), uniform({c.O, c.C, c.k, c.k}, gen), uniform({c.O}, gen)});
    check_device("conv2d no bias" + s, [args](auto const& in) { return conv2d(in[0], in[1], {}, args); },
                 {uniform({c.N, c.C, c.H, c.W}, gen), uniform({c.O, c.C, c.k, c.k}, gen)});
  }
  // 8 → 8 channels, 3×3, stride 1: the Winograd kernels, with relu and the fused 2×2 pooling. Distinct inputs
  // keep the pooling windows and the relu away from ties and kinks at the finite-difference step.
  Conv2dArgs const relu{.epilogue = Epilogue::kRelu}, pool{.epilogue = Epilogue::kReluMaxPool2};
  std::vector<Tensor<double>> const in{distinct({1, 8, 6, 6}, gen), uniform({8, 8, 3, 3}, gen, -0.3, 0.3),
                                       uniform({8}, gen)};
  check_device(
      "conv2d+relu", [relu](auto const& v) { return conv2d(v[0], v[1], v[2], relu); }, in);
  check_device(
      "conv2d+relu+max_pool2d", [pool](auto const& v) { return conv2d(v[0], v[1], v[2], pool); }, in);
}

TEST_CASE("device: max_pool2d (kernel 2 and 3, overlapping windows)") {
  Generator gen(8);
  check_device("max_pool2d 2", [](auto const& in) { return max_pool2d(in[0], 2); }, {distinct({2, 2, 6, 5}, gen)});
  check_device("max_pool2d 3/1", [](auto const& in) { return max_pool2d(in[0], 3, 1); }, {distinct({1, 2, 6, 6}, gen)});
  check_device("max_pool2d 3/2", [](auto const& in) { return max_pool2d(in[0], 3, 2); }, {distinct({1, 3, 7, 7}, gen)});
}

TEST_CASE("device: batch_norm2d in training (batch statistics) and evaluation (running statistics)") {
  Generator gen(9);
  Both<double> const mean(uniform({3}, gen)), var(uniform({3}, gen, 0.5, 2.0));
  for (Mode mode : {Mode::kTrain, Mode::kEval}) {
    check_device(mode == Mode::kTrain ? "batch_norm2d train" : "batch_norm2d eval",
                 [&](auto const& in) {
                   using S = space_of<decltype(in[0])>;
                   // Fresh running statistics per call: training updates them in place.
                   Tensor<double, S> rm(Shape{3}), rv(Shape{3});
                   Kernels<S>::copy(3, mean.in<S>().data(), rm.data());
                   Kernels<S>::copy(3, var.in<S>().data(), rv.data());
                   return batch_norm2d(in[0], in[1], in[2], rm, rv, mode);
                 },
                 {uniform({3, 3, 2, 3}, gen), uniform({3}, gen), uniform({3}, gen)});
  }
}

TEST_CASE("device: dropout in training (mask from the re-seeded generator, drawn on the host), eval is the identity") {
  Generator gen(10);
  for (Mode mode : {Mode::kTrain, Mode::kEval})
    check_device("dropout",
                 [mode](auto const& in) {
                   Generator g(3);
                   return dropout(in[0], 0.4, mode, g);
                 },
                 {uniform({5, 6}, gen)});
}

TEST_CASE("device: a small CNN end to end (conv, batch_norm, relu, max_pool, flatten, linear, cross_entropy)") {
  Generator gen(11);
  Both<double> const rm(zeros<double>({2})), rv(full<double>({2}, 1.0));
  Both<std::int32_t> const ids(random_targets(2, 3, gen));
  check_device("cnn",
               [&](auto const& in) {
                 using S = space_of<decltype(in[0])>;
                 Tensor<double, S> m(Shape{2}), v(Shape{2});
                 Kernels<S>::copy(2, rm.in<S>().data(), m.data());
                 Kernels<S>::copy(2, rv.in<S>().data(), v.data());
                 auto h = conv2d(in[0], in[1], in[2], Conv2dArgs{.padding = 1});
                 h = max_pool2d(relu(batch_norm2d(h, in[3], in[4], m, v, Mode::kTrain)), 2);
                 return cross_entropy(linear(flatten(h), in[5]), ids.in<S>());
               },
               {distinct({2, 1, 4, 4}, gen), uniform({2, 1, 3, 3}, gen), uniform({2}, gen), uniform({2}, gen, 0.5, 1.5),
                uniform({2}, gen), uniform({3, 8}, gen)});
}

TEST_CASE("device: embedding (repeated ids, 1-D to 3-D ids) and a table used twice (tied head)") {
  Generator gen(12);
  // Row 1 is used three times, row 3 twice, row 4 never: the scatter-add must add every use and leave row 4 zero.
  Both<std::int32_t> const ids(from_values<std::int32_t>(Shape{2, 4}, {1, 3, 0, 1, 2, 1, 3, 5}));
  check_device("embedding (2, 4) ids",
               [&](auto const& in) { return embedding(in[0], ids.in<space_of<decltype(in[0])>>()); },
               {uniform({6, 3}, gen)});
  Both<std::int32_t> const flat(from_values<std::int32_t>(Shape{5}, {2, 2, 0, 2, 1}));
  check_device("embedding (5) ids",
               [&](auto const& in) { return embedding(in[0], flat.in<space_of<decltype(in[0])>>()); },
               {uniform({3, 4}, gen)});
  Both<std::int32_t> const cube(from_values<std::int32_t>(Shape{2, 2, 2}, {0, 1, 1, 0, 3, 3, 3, 2}));
  check_device("embedding (2, 2, 2) ids",
               [&](auto const& in) { return embedding(in[0], cube.in<space_of<decltype(in[0])>>()); },
               {uniform({4, 2}, gen)});
  // The second contribution to the table's gradient adds to the first (the kernel's beta = 1).
  check_device("tied embedding and head",
               [&](auto const& in) { return linear(embedding(in[0], ids.in<space_of<decltype(in[0])>>()), in[0]); },
               {uniform({6, 3}, gen)});

  // Against a direct loop: the gradient of sum(embedding(table, ids) * w) is, per row, the sum of w's rows whose
  // id names it (and zero for an unused row).
  VarDev table(to_space<DeviceSpace>(uniform({6, 3}, gen)), RequiresGrad::kYes);
  Tensor<double> const w = uniform({2, 4, 3}, gen);
  backward(sum(mul(embedding(table, ids.device), VarDev(to_space<DeviceSpace>(w)))));
  std::vector<double> const g = host_values(table.grad());
  for (std::int64_t v = 0; v < 6; ++v)
    for (std::int64_t c = 0; c < 3; ++c) {
      double want = 0;
      for (std::int64_t i = 0; i < 8; ++i)
        if (ids.host[i] == v) want += w[i * 3 + c];
      CHECK(g[static_cast<std::size_t>(v * 3 + c)] == doctest::Approx(want).epsilon(1e-15));
    }
}

// Found by the embedding kernel and reported at the next host read (device_errors.hpp), naming the position and
// the id; the bad row is NaN, the others are gathered, and the device stays usable.
TEST_CASE("device: an embedding id outside the table is an error at the next host read, naming 'embedding'") {
  Generator gen(13);
  Tensor<double> const t = uniform({4, 2}, gen);
  Tensor<double, DeviceSpace> const table = to_space<DeviceSpace>(t);
  // The kernel told the table's rows (every id checked): id 4 of a 4-row table.
  Tensor<std::int32_t, DeviceSpace> const bad = to_space<DeviceSpace>(from_values<std::int32_t>(Shape{3}, {0, 4, 1}));
  Tensor<double, DeviceSpace> y(Shape{3, 2});
  Kernels<DeviceSpace>::embedding_fwd(3, 4, 2, table.data(), bad.data(), y.data());
  check_throws_with<ArgumentError>([&] { (void)host_values(y); }, {"embedding: id 4 at position 1 is outside [0, 4)",
                                                                   "reported at the next host read"});
  std::vector<double> const v = host_values(y);  // reported once: this read is clean
  CHECK(v[0] == t[0]);
  CHECK(v[1] == t[1]);
  CHECK(std::isnan(v[2]));
  CHECK(std::isnan(v[3]));
  CHECK(v[4] == t[2]);
  CHECK(v[5] == t[3]);
  // Through the op: an id past the table, and a negative one.
  {
    VarDev tv(to_space<DeviceSpace>(t), RequiresGrad::kYes);
    VarDev const e = embedding(tv, bad);
    check_throws_with<ArgumentError>([&] { (void)host_values(e.value()); },
                                     {"embedding: id 4 at position 1 is outside [0, 4)"});
  }
  VarDev tv(to_space<DeviceSpace>(t), RequiresGrad::kYes);
  Tensor<std::int32_t, DeviceSpace> const neg = to_space<DeviceSpace>(from_values<std::int32_t>(Shape{3}, {2, 0, -3}));
  VarDev const e = embedding(tv, neg);  // no throw here: nothing was read back
  check_throws_with<ArgumentError>(
      [&] { (void)host_values(e.value()); },
      {"embedding: id -3 at position 2 is outside [0, 4)", "reported at the next host read"});
  check_device_errors();  // nothing pending
}

TEST_CASE("device: layer_norm with and without weight and bias, and x used twice") {
  Generator gen(14);
  for (Shape xs : {Shape{2, 3, 5}, Shape{4, 1}, Shape{3, 7}}) {
    std::int64_t const C = xs[xs.rank() - 1];
    std::string const s = detail::cat(" ", xs);
    check_device("layer_norm affine" + s, [](auto const& in) { return layer_norm(in[0], in[1], in[2]); },
                 {uniform(xs, gen), uniform({C}, gen), uniform({C}, gen)});
    check_device("layer_norm weight only" + s, [](auto const& in) { return layer_norm(in[0], in[1], none(in[0])); },
                 {uniform(xs, gen), uniform({C}, gen)});
    check_device("layer_norm bias only" + s, [](auto const& in) { return layer_norm(in[0], none(in[0]), in[1]); },
                 {uniform(xs, gen), uniform({C}, gen)});
    check_device("layer_norm plain eps 1e-3" + s,
                 [](auto const& in) { return layer_norm(in[0], none(in[0]), none(in[0]), {.eps = 1e-3}); },
                 {uniform(xs, gen)});
  }
  check_device("layer_norm, x constant (no gx)", [](auto const& in) { return layer_norm(in[0], in[1], in[2]); },
               {uniform({3, 4}, gen), uniform({4}, gen), uniform({4}, gen)}, {false, true, true});
  check_device("layer_norm(x)·x, w and b used twice (beta 1)",
               [](auto const& in) { return mul(add(layer_norm(in[0], in[1], in[2]), mul(in[1], in[2])), in[0]); },
               {uniform({3, 4}, gen), uniform({4}, gen), uniform({4}, gen)});

  // Against a direct loop in double: biased variance, eps inside the root, then weight and bias.
  Tensor<double> const x = uniform({3, 5}, gen), w = uniform({5}, gen), b = uniform({5}, gen);
  VarDev const y = layer_norm(VarDev(to_space<DeviceSpace>(x)), VarDev(to_space<DeviceSpace>(w)),
                              VarDev(to_space<DeviceSpace>(b)), {.eps = 1e-5});
  std::vector<double> const v = host_values(y.value());
  for (int r = 0; r < 3; ++r) {
    double m = 0, q = 0;
    for (int c = 0; c < 5; ++c) m += x[r * 5 + c] / 5;
    for (int c = 0; c < 5; ++c) q += (x[r * 5 + c] - m) * (x[r * 5 + c] - m) / 5;
    for (int c = 0; c < 5; ++c)
      CHECK(v[static_cast<std::size_t>(r * 5 + c)] ==
            doctest::Approx((x[r * 5 + c] - m) / std::sqrt(q + 1e-5) * w[c] + b[c]).epsilon(1e-12));
  }
}

TEST_CASE("device: gelu, exact (erf) and tanh forms") {
  Generator gen(15);
  for (auto a : {GeluApprox::kErf, GeluApprox::kTanh}) {
    check_device(a == GeluApprox::kErf ? "gelu erf" : "gelu tanh", [a](auto const& in) { return gelu(in[0], a); },
                 {uniform({4, 6}, gen, -3.0, 3.0)});
    check_device(a == GeluApprox::kErf ? "gelu erf, x used twice" : "gelu tanh, x used twice",
                 [a](auto const& in) { return mul(gelu(in[0], a), in[0]); }, {uniform({7}, gen, -3.0, 3.0)});
  }
  // Against the formulas in double.
  Tensor<double> const x = uniform({64}, gen, -5.0, 5.0);
  VarDev const xd(to_space<DeviceSpace>(x));
  std::vector<double> const ye = host_values(gelu(xd, GeluApprox::kErf).value());
  std::vector<double> const yt = host_values(gelu(xd, GeluApprox::kTanh).value());
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const u = x[i], t = std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u));
    CHECK(ye[static_cast<std::size_t>(i)] ==
          doctest::Approx(0.5 * u * (1 + std::erf(u / std::sqrt(2.0)))).epsilon(1e-14));
    CHECK(yt[static_cast<std::size_t>(i)] == doctest::Approx(0.5 * u * (1 + t)).epsilon(1e-14));
  }
}

TEST_CASE("device: softmax of scaled scores, plain and causal (masked keys exactly 0)") {
  Generator gen(16);
  for (auto m : {SoftmaxMask::kNone, SoftmaxMask::kCausal})
    for (std::int64_t T : {1, 3, 5}) {
      SoftmaxArgs const args{.scale = 0.7, .mask = m};
      std::string const s = detail::cat(m == SoftmaxMask::kCausal ? "softmax causal T " : "softmax T ", T);
      check_device(s, [args](auto const& in) { return softmax(in[0], args); }, {uniform({2, 3, T, T}, gen, -2, 2)});
      check_device(s + ", x used twice", [args](auto const& in) { return mul(softmax(in[0], args), in[0]); },
                   {uniform({2, T, T}, gen, -2, 2)});
      // Rows sum to 1 over the visible keys j <= r mod T; the others are exactly 0.
      VarDev const y = softmax(VarDev(to_space<DeviceSpace>(uniform({2, 3, T, T}, gen, -2, 2))), args);
      std::vector<double> const v = host_values(y.value());
      for (std::int64_t r = 0; r < 2 * 3 * T; ++r) {
        double sum = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          double const p = v[static_cast<std::size_t>(r * T + j)];
          if (m == SoftmaxMask::kCausal && j > r % T) CHECK(p == 0.0);
          sum += p;
        }
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-14));
      }
    }
  // The formula on a causal 3×3 at scale 2: row 0 sees key 0 only, row 1 keys 0 and 1.
  VarDev const x(to_space<DeviceSpace>(from_values<double>(Shape{3, 3}, {1, 5, 5, 2, 3, 9, 0, 1, 2})));
  std::vector<double> const y = host_values(softmax(x, {.scale = 2.0, .mask = SoftmaxMask::kCausal}).value());
  CHECK(y[0] == 1.0);
  CHECK(y[3] == doctest::Approx(std::exp(4.0) / (std::exp(4.0) + std::exp(6.0))).epsilon(1e-14));
  CHECK(y[5] == 0.0);
}

TEST_CASE("device: transpose of axis pairs of 2-D to 4-D tensors (adjacent, apart, negative)") {
  Generator gen(17);
  struct Case {
    Shape s;
    int i, j;
  };
  for (Case const& c :
       {Case{Shape{3, 4}, 0, 1}, Case{Shape{2, 3, 4}, 0, 2}, Case{Shape{2, 3, 4}, 1, 2}, Case{Shape{2, 3, 4, 5}, 1, 2},
        Case{Shape{2, 3, 4, 5}, 0, 3}, Case{Shape{2, 3, 4, 5}, -1, -2}, Case{Shape{2, 1, 3, 2}, 1, 3}}) {
    int const i = c.i, j = c.j;
    check_device(detail::cat("transpose ", i, ",", j, " of ", c.s),
                 [i, j](auto const& in) { return transpose(in[0], i, j); }, {uniform(c.s, gen)});
  }
  // x used twice: the transpose's backward adds (beta 1) to the other use's gradient.
  check_device("transpose(x)ᵀ + x", [](auto const& in) { return add(transpose(in[0], 0, 1), in[0]); },
               {uniform({4, 4}, gen)});
  // Against index arithmetic: (2, 3, 4) with axes 0 and 2 swapped.
  Tensor<double> const x = uniform({2, 3, 4}, gen);
  std::vector<double> const y = host_values(transpose(VarDev(to_space<DeviceSpace>(x)), 0, 2).value());
  for (std::int64_t a = 0; a < 2; ++a)
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t c = 0; c < 4; ++c)
        CHECK(y[static_cast<std::size_t>((c * 3 + b) * 2 + a)] == x[(a * 3 + b) * 4 + c]);
}

TEST_CASE("device: slice_last and split_last (q, k, v), a slice of the whole row, and x used twice") {
  Generator gen(18);
  check_device("split_last into 3",
               [](auto const& in) {
                 auto p = split_last(in[0], 3);
                 return add(mul(p[0], p[1]), scale(p[2], 2.0));
               },
               {uniform({2, 3, 6}, gen)});
  check_device("one slice only", [](auto const& in) { return slice_last(in[0], 1, 4); }, {uniform({2, 3, 6}, gen)});
  check_device("the whole row, and x again", [](auto const& in) { return add(slice_last(in[0], 0, 5), in[0]); },
               {uniform({3, 5}, gen)});
  check_device("a slice, and x again",
               [](auto const& in) { return add(slice_last(in[0], 2, 3), slice_last(in[0], 0, 3)); },
               {uniform({4, 5}, gen)});
  Tensor<double> const x = uniform({2, 3, 6}, gen);
  std::vector<double> const y = host_values(slice_last(VarDev(to_space<DeviceSpace>(x)), 2, 3).value());
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 3; ++c) CHECK(y[static_cast<std::size_t>(r * 3 + c)] == x[r * 6 + 2 + c]);
}

TEST_CASE("device: bmm with every transpose combination, 3-D and 4-D batches") {
  Generator gen(19);
  for (auto ta : {Trans::kNo, Trans::kYes})
    for (auto tb : {Trans::kNo, Trans::kYes}) {
      std::int64_t const B = 2, H = 3, M = 2, K = 4, N = 3;
      Shape const as = ta == Trans::kNo ? Shape{B, H, M, K} : Shape{B, H, K, M};
      Shape const bs = tb == Trans::kNo ? Shape{B, H, K, N} : Shape{B, H, N, K};
      std::string const what = detail::cat("bmm ta ", int(ta), " tb ", int(tb));
      check_device(what, [ta, tb](auto const& in) { return bmm(in[0], in[1], ta, tb); },
                   {uniform(as, gen), uniform(bs, gen)});
      check_device(what + " 3-D, b constant",
                   [ta, tb](auto const& in) {
                     Shape const &s0 = in[0].shape(), &s1 = in[1].shape();
                     return bmm(reshape(in[0], Shape{s0[0] * s0[1], s0[2], s0[3]}),
                                reshape(in[1], Shape{s1[0] * s1[1], s1[2], s1[3]}), ta, tb);
                   },
                   {uniform(as, gen), uniform(bs, gen)}, {true, false});
    }
}

TEST_CASE("device: causal self-attention composed from the ops (split, transpose, bmm, softmax, layer_norm, gelu)") {
  Generator gen(20);
  std::int64_t const B = 2, T = 4, H = 2, D = 3, C = H * D;
  check_device("attention block",
               [&](auto const& in) {
                 auto qkv = split_last(in[0], 3);
                 auto heads = [&](auto const& t) { return transpose(reshape(t, Shape{B, T, H, D}), 1, 2); };
                 auto att = softmax(bmm(heads(qkv[0]), heads(qkv[1]), Trans::kNo, Trans::kYes),
                                    {.scale = 1 / std::sqrt(double(D)), .mask = SoftmaxMask::kCausal});
                 auto y = reshape(transpose(bmm(att, heads(qkv[2])), 1, 2), Shape{B, T, C});
                 return gelu(layer_norm(y, in[1], in[2]), GeluApprox::kTanh);
               },
               {uniform({B, T, 3 * C}, gen), uniform({C}, gen), uniform({C}, gen)});
}

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

TEST_CASE("device: matmul and linear (with and without bias, 2-D and 3-D input)") {
  Generator gen(1);
  check_device("matmul", [](auto const& in) { return matmul(in[0], in[1]); },
               {uniform({3, 4}, gen), uniform({4, 5}, gen)});
  check_device("matmul, b constant", [](auto const& in) { return matmul(in[0], in[1]); },
               {uniform({3, 4}, gen), uniform({4, 5}, gen)}, {true, false});
  check_device("linear+bias", [](auto const& in) { return linear(in[0], in[1], in[2]); },
               {uniform({2, 3, 4}, gen), uniform({5, 4}, gen), uniform({5}, gen)});
  check_device("linear", [](auto const& in) { return linear(in[0], in[1]); },
               {uniform({6, 4}, gen), uniform({3, 4}, gen)});
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

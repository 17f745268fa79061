// nn: layer initialisation, parameter names/order, containers, train/eval, BatchNorm buffers, the arena.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"

using namespace ddp;

TEST_CASE("Linear and Conv2d follow PyTorch's default init bounds and shapes") {
  Generator g(42);
  nn::Linear l(100, 7, g);
  CHECK(l.weight.shape() == Shape{7, 100});
  CHECK(l.bias.shape() == Shape{7});
  double const bound = 1.0 / std::sqrt(100.0);
  double maxabs = 0;
  for (std::int64_t i = 0; i < 700; ++i) maxabs = std::max(maxabs, double(std::abs(l.weight.value()[i])));
  CHECK(maxabs <= bound);
  CHECK(maxabs > 0.9 * bound);  // fills the range
  nn::Conv2d c(3, 8, 5, g, {.stride = 2, .padding = 1});
  CHECK(c.weight.shape() == Shape{8, 3, 5, 5});
  double cb = 1.0 / std::sqrt(75.0), cm = 0;
  for (std::int64_t i = 0; i < c.weight.numel(); ++i) cm = std::max(cm, double(std::abs(c.weight.value()[i])));
  CHECK(cm <= cb);
  auto y = c(Var(zeros<float>({2, 3, 11, 11})));
  CHECK(y.shape() == Shape{2, 8, 5, 5});
}

TEST_CASE("init is reproducible from the seed") {
  Generator a(7), b(7), c(8);
  nn::Linear la(5, 5, a), lb(5, 5, b), lc(5, 5, c);
  for (std::int64_t i = 0; i < 25; ++i) CHECK(la.weight.value()[i] == lb.weight.value()[i]);
  bool differs = false;
  for (std::int64_t i = 0; i < 25; ++i) differs |= la.weight.value()[i] != lc.weight.value()[i];
  CHECK(differs);
}

TEST_CASE("Sequential names parameters by index or given name, in registration order") {
  Generator g(1);
  nn::Sequential s(nn::named("fc1", nn::Linear(4, 3, g)), nn::ReLU(), nn::Linear(3, 2, g));
  auto ps = s.named_parameters();
  REQUIRE(ps.size() == 4);
  CHECK(ps[0].name == "fc1.weight");
  CHECK(ps[1].name == "fc1.bias");
  CHECK(ps[2].name == "2.weight");
  CHECK(ps[3].name == "2.bias");
  static_assert(nn::Model<decltype(s)>);
  static_assert(!nn::Model<int>);

  nn::AnySequential<float> d;
  d.push_back("a", nn::Linear(4, 3, g)).push_back(nn::Tanh()).push_back("b", nn::Linear(3, 2, g));
  auto dp = d.named_parameters();
  REQUIRE(dp.size() == 4);
  CHECK(dp[2].name == "b.weight");
  CHECK(d(Var(zeros<float>({5, 4}))).shape() == Shape{5, 2});
}

TEST_CASE("BatchNorm2d: batch statistics in training, running estimates in eval") {
  nn::BatchNorm2d bn(2, {.momentum = 0.5});
  auto bufs = bn.named_buffers();
  REQUIRE(bufs.size() == 2);
  CHECK(bufs[0].name == "running_mean");
  Tensor<float> x(Shape{2, 2, 1, 2});
  float vals[] = {1, 3, 10, 10, 5, 7, 20, 30};  // channel 0: 1,3,5,7 channel 1: 10,10,20,30
  for (int i = 0; i < 8; ++i) x[i] = vals[i];
  auto y = bn(Var(x));
  // channel 0: mean 4, biased var 5 -> (1-4)/sqrt(5+eps)
  CHECK(y.value()[0] == doctest::Approx(-3.0 / std::sqrt(5.0 + 1e-5)).epsilon(1e-5));
  CHECK(bn.running_mean[0] == doctest::Approx(0.5 * 4));
  CHECK(bn.running_var[0] == doctest::Approx(0.5 * 1 + 0.5 * (20.0 / 3.0)));  // unbiased var 20/3
  bn.set_mode(Mode::kEval);
  auto ye = bn(Var(x));
  CHECK(ye.value()[0] == doctest::Approx((1 - 2.0) / std::sqrt(0.5 + 10.0 / 3.0 + 1e-5)).epsilon(1e-5));
}

TEST_CASE("Dropout: seeded masks, identity in eval, scale 1/(1-p)") {
  nn::Dropout d1(0.25, 3), d2(0.25, 3);
  auto x = Var(full<float>({1000}, 1.0f));
  auto a = d1(x), b = d2(x);
  int zeros_n = 0;
  for (int i = 0; i < 1000; ++i) {
    CHECK(a.value()[i] == b.value()[i]);
    CHECK((a.value()[i] == 0.0f || a.value()[i] == doctest::Approx(1.0f / 0.75f)));
    zeros_n += a.value()[i] == 0.0f;
  }
  CHECK(zeros_n > 180);
  CHECK(zeros_n < 320);
  d1.set_mode(Mode::kEval);
  auto e = d1(x);
  for (int i = 0; i < 1000; ++i) CHECK(e.value()[i] == 1.0f);
}

TEST_CASE("ParameterArena packs in reverse registration order and parameters become views") {
  Generator g(3);
  nn::Sequential s(nn::Linear(4, 3, g), nn::ReLU(), nn::Linear(3, 2, g));
  auto before = s.named_parameters();
  std::vector<float> w0;
  for (auto& p : before)
    for (std::int64_t i = 0; i < p.var.numel(); ++i) w0.push_back(p.var.value()[i]);
  nn::ParameterArena<float> arena(s);
  auto const& es = arena.entries();
  REQUIRE(es.size() == 4);
  CHECK(arena.numel() == 12 + 3 + 6 + 2);
  CHECK(es[3].offset == 0);  // last registered first
  CHECK(es[2].offset == 2);
  CHECK(es[1].offset == 8);
  CHECK(es[0].offset == 11);
  // Values were preserved and live in the arena.
  std::size_t k = 0;
  for (auto& e : es) {
    CHECK(e.var.value().data() == arena.values().data() + e.offset);
    for (std::int64_t i = 0; i < e.numel; ++i) CHECK(e.var.value()[i] == w0[k++]);
  }
  // Gradients land in the grad arena; zero_grad forgets them without touching memory.
  backward(sum(s(Var(full<float>({2, 4}, 1.0f)))));
  CHECK(arena.all_grads_defined());
  CHECK(es[3].var.grad().data() == arena.grads().data());
  CHECK(es[3].var.grad()[0] == doctest::Approx(2.0f));  // d/db of a sum over 2 rows
  arena.zero_grad();
  CHECK_FALSE(arena.all_grads_defined());
  backward(sum(s(Var(full<float>({1, 4}, 1.0f)))));
  CHECK(es[3].var.grad()[0] == doctest::Approx(1.0f));  // overwritten, not accumulated
  arena.zero_grad();
  arena.materialize_grads();
  for (std::int64_t i = 0; i < arena.numel(); ++i) CHECK(arena.grads()[i] == 0.0f);
}

TEST_CASE(
    "ParameterArena: reserved slots round up to whole 64-byte lines, so no reserve moves a parameter within "
    "its line") {
  Generator g(3);
  nn::Sequential s(nn::Linear(4, 3, g), nn::ReLU(), nn::Linear(3, 2, g));  // 12, 3, 6, 2 elements
  auto const params = s.named_parameters();
  std::vector<std::int64_t> plain_offsets;
  {
    nn::ParameterArena<float> plain(params);
    for (auto const& e : plain.entries()) plain_offsets.push_back(e.offset);
  }
  nn::ParameterArena<float> reserved(params, {5, 0, 17, 1});  // after parameters 0 .. 3, registration order
  auto const& es = reserved.entries();
  CHECK(es[3].offset == 0);
  CHECK(es[2].offset == 2 + 16);           // 1 slot, a whole line of 16 floats
  CHECK(es[1].offset == 2 + 16 + 6 + 32);  // 17 slots: two lines
  CHECK(es[0].offset == 2 + 16 + 6 + 32 + 3);
  CHECK(reserved.numel() == es[0].offset + 12 + 16);
  for (std::size_t k = 0; k < es.size(); ++k) CHECK(es[k].offset % 16 == plain_offsets[k] % 16);
  nn::ParameterArena<double> wide(nn::Sequential(nn::basic_linear<double>(4, 3, g)).named_parameters(), {1, 1});
  CHECK(wide.entries()[0].offset == 3 + 8);  // bias first, then a line of 8 doubles
}

TEST_CASE("ParameterArena keeps gradients in the storage it is given, which must hold exactly the arena") {
  Var w(full<float>({3}, 1.0f), RequiresGrad::kYes);
  Var b(full<float>({2}, 1.0f), RequiresGrad::kYes);
  std::vector<nn::NamedParameter<float, HostSpace>> const params{{"w", w}, {"b", b}};
  auto block = std::make_shared<std::vector<float>>(5, -1.0f);  // e.g. a communicator's shared window
  std::int64_t asked = -1;
  nn::ParameterArena<float> arena(params, {}, [&](std::int64_t n) {
    asked = n;
    return Tensor<float>::view(block, block->data(), Shape{n});
  });
  CHECK(asked == 5);
  CHECK(arena.grads().data() == block->data());
  backward(sum(add(sum(w), sum(b))));
  CHECK(w.grad().data() == block->data() + 2);  // b first (reverse registration order), then w
  CHECK((*block)[2] == doctest::Approx(1.0f));
  CHECK_THROWS_WITH_AS(nn::ParameterArena<float>(params, {}, [](std::int64_t n) { return zeros<float>({n + 1}); }),
                       doctest::Contains("the gradient storage holds 6 elements, the parameters need 5"),
                       ArgumentError);
}

TEST_CASE("ParameterArena rejects non-leaves, skips frozen parameters and packs shared weights once") {
  Var w(zeros<float>({3}), RequiresGrad::kYes);
  Var d = scale(w, 2.0f);  // an op's output is no parameter
  CHECK_THROWS_WITH_AS(nn::ParameterArena<float>(std::vector<nn::NamedParameter<float, HostSpace>>{{"d", d}}),
                       doctest::Contains("'d'"), ArgumentError);
  Var c(zeros<float>({2}));  // frozen (requires_grad false): accepted, not packed
  nn::ParameterArena<float> a(std::vector<nn::NamedParameter<float, HostSpace>>{{"w", w}, {"c", c}, {"tied", w}});
  CHECK(a.count() == 1);
  CHECK(a.numel() == 3);
  CHECK(a.current());
  nn::ParameterArena<float> b(std::vector<nn::NamedParameter<float, HostSpace>>{{"w", w}});  // re-packs w
  CHECK_FALSE(a.current());
  CHECK_THROWS_WITH_AS(a.check_current("SGD"), doctest::Contains("'w'"), ArgumentError);
  CHECK(b.current());
}

TEST_CASE("Sequential fuses a Conv2d directly followed by a ReLU: same values and gradients, one op") {
  static_assert(nn::Sequential<nn::Conv2d, nn::ReLU, nn::Flatten>::fuses_relu<0>());
  static_assert(!nn::Sequential<nn::Conv2d, nn::Flatten, nn::ReLU>::fuses_relu<0>());
  static_assert(!nn::Sequential<nn::Linear, nn::ReLU>::fuses_relu<0>());
  static_assert(nn::Sequential<nn::Named<nn::Conv2d>, nn::Named<nn::ReLU>>::fuses_relu<0>());
  Generator init(3), data(4);
  nn::Sequential fused(nn::Conv2d(3, 16, 3, init), nn::ReLU(), nn::Conv2d(16, 8, 3, init, {.padding = 1}), nn::ReLU());
  Tensor<float> x(Shape{2, 3, 10, 9});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
  Var out = fused(Var(x));
  CHECK(std::string(out.node().op) == "conv2d+relu");
  backward(sum(out * out));
  // The same layers applied one by one (conv2d, then relu).
  auto& c1 = fused.get<0>();
  auto& c2 = fused.get<2>();
  std::vector<Tensor<float>> grads;
  for (auto* p : {&c1.weight, &c1.bias, &c2.weight, &c2.bias}) grads.push_back(clone(p->grad())), p->zero_grad();
  Var ref = relu(c2.forward(relu(c1.forward(Var(x)))));
  CHECK(std::string(ref.node().op) == "relu");
  backward(sum(ref * ref));
  auto same = [](Tensor<float> const& a, Tensor<float> const& b) {
    if (!(a.shape() == b.shape())) return false;
    for (std::int64_t k = 0; k < a.numel(); ++k)
      if (a[k] != b[k]) return false;
    return true;
  };
  CHECK(same(out.value(), ref.value()));
  // AnySequential (layers chosen at run time) fuses the same pairs; these layers share fused's parameters.
  nn::AnySequential<> any;
  any.push_back(c1).push_back(nn::ReLU()).push_back(c2).push_back(nn::Flatten()).push_back(nn::ReLU());
  Var const a = any(Var(x));
  CHECK(std::string(a.node().op) == "relu");  // conv2 is followed by Flatten, not ReLU: not fused
  CHECK(std::string(a.node().parents[0]->parents[0]->op) == "conv2d");
  CHECK(std::string(a.node().parents[0]->parents[0]->parents[0]->op) == "conv2d+relu");
  int i = 0;
  for (auto* p : {&c1.weight, &c1.bias, &c2.weight, &c2.bias}) CHECK(same(p->grad(), grads[i++]));
}

TEST_CASE("the fusion rule both Sequential containers share") {
  using nn::detail::Follower;
  using nn::detail::fusion_rule;
  static_assert(fusion_rule(true, Follower::kRelu, Follower::kMaxPool2x2).epilogue == Epilogue::kReluMaxPool2);
  static_assert(fusion_rule(true, Follower::kRelu, Follower::kMaxPool2x2).absorbed == 2);
  static_assert(fusion_rule(true, Follower::kRelu, Follower::kOther).epilogue == Epilogue::kRelu);
  static_assert(fusion_rule(true, Follower::kRelu, Follower::kRelu).absorbed == 1);
  static_assert(fusion_rule(true, Follower::kMaxPool2x2, Follower::kRelu).absorbed == 0);   // pool before ReLU
  static_assert(fusion_rule(false, Follower::kRelu, Follower::kMaxPool2x2).absorbed == 0);  // Linear, ReLU, ...
  CHECK(nn::detail::follower_of(nn::MaxPool2d(2)) == Follower::kMaxPool2x2);
  CHECK(nn::detail::follower_of(nn::MaxPool2d(2, 1)) == Follower::kOther);  // stride 1: not fused
  CHECK(nn::detail::follower_of(nn::MaxPool2d(3)) == Follower::kOther);
  CHECK(nn::detail::follower_of(nn::ReLU()) == Follower::kRelu);
}

TEST_CASE("Sequential and AnySequential fuse Conv2d, ReLU, MaxPool2d(2) into one op; other pools stay separate") {
  static_assert(nn::Sequential<nn::Conv2d, nn::ReLU, nn::MaxPool2d>::fuses_relu_pool<0>());
  static_assert(!nn::Sequential<nn::Conv2d, nn::ReLU, nn::Flatten>::fuses_relu_pool<0>());
  Generator init(5), data(6);
  Tensor<float> x(Shape{2, 8, 12, 12});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
  nn::Sequential s2(nn::Conv2d(8, 8, 3, init), nn::ReLU(), nn::MaxPool2d(2));
  nn::Sequential s3(nn::Conv2d(8, 8, 3, init), nn::ReLU(), nn::MaxPool2d(3));
  CHECK(std::string(s2(Var(x)).node().op) == "conv2d+relu+max_pool2d");
  Var const y3 = s3(Var(x));
  CHECK(std::string(y3.node().op) == "max_pool2d");
  CHECK(std::string(y3.node().parents[0]->op) == "conv2d+relu");
  nn::AnySequential<> any;
  any.push_back(s2.get<0>()).push_back(nn::ReLU()).push_back(nn::MaxPool2d(2));
  Var const a = any(Var(x));
  CHECK(std::string(a.node().op) == "conv2d+relu+max_pool2d");
  Tensor<float> const ref = s2(Var(x)).value();
  bool same = a.value().shape() == ref.shape();
  for (std::int64_t i = 0; same && i < ref.numel(); ++i) same = a.value()[i] == ref[i];
  CHECK(same);
}

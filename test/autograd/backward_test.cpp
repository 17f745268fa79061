// backward() and the grad-ready hook: once per backward on diamonds and reused parameters, accumulation,
// zero_grad, NoGradGuard, retain_graph, deep chains, and the errors it raises.
#include <doctest/doctest.h>

#include <pthread.h>

#include <thread>
#include <vector>

#include "test/autograd/testing.hpp"

using namespace ddp;
using namespace ddp::testing;

namespace {

// Snapshot of a gradient taken inside a hook.
struct HookLog {
  int calls = 0;
  std::vector<double> grad;  // copy of the gradient at the moment the hook ran
};

void watch(VarD const& v, HookLog& log) {
  v.set_grad_hook([&log](NodeD& n) {
    ++log.calls;
    log.grad.assign(n.grad.data(), n.grad.data() + n.grad.numel());
  });
}

std::vector<double> values(Tensor<double> const& t) { return {t.data(), t.data() + t.numel()}; }

}  // namespace

TEST_CASE("grad hook: diamond x -> a, b -> a + b fires once, after both branches contributed") {
  Generator gen(1);
  for (Shape s : {Shape{1}, Shape{3}, Shape{2, 5}}) {
    VarD x = param(uniform(s, gen));
    HookLog log;
    // The hook checks, while it runs, that the gradient is already final: d/dx Σ(2x + x²) = 2 + 2x.
    // (Captures the value tensor, not x: a hook holding its own node's handle would be a reference cycle.)
    x.set_grad_hook([&log, xv = x.value()](NodeD& n) {
      ++log.calls;
      log.grad.assign(n.grad.data(), n.grad.data() + n.grad.numel());
      for (std::int64_t i = 0; i < n.grad.numel(); ++i)
        CHECK(n.grad[i] == doctest::Approx(2 + 2 * xv[i]).epsilon(1e-14));
    });
    VarD a = scale(x, 2.0);
    VarD b = mul(x, x);
    backward(sum(add(a, b)));
    CHECK(log.calls == 1);
    CHECK(log.grad == values(x.grad()));  // nothing was added after the hook ran
  }
}

TEST_CASE("grad hook: unbalanced diamond (branches of different depth) fires after the deeper branch") {
  Generator gen(2);
  VarD x = param(uniform(Shape{4, 3}, gen));
  HookLog log;
  watch(x, log);
  // short branch: x itself; long branch: tanh(tanh(tanh(x))). The short one's contribution arrives first.
  VarD deep = tanh(tanh(tanh(x)));
  VarD y = sum(add(x, deep));
  backward(y);
  CHECK(log.calls == 1);
  CHECK(log.grad == values(x.grad()));
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    double const t1 = std::tanh(x.value()[i]), t2 = std::tanh(t1), t3 = std::tanh(t2);
    double const expect = 1 + (1 - t3 * t3) * (1 - t2 * t2) * (1 - t1 * t1);
    CHECK(x.grad()[i] == doctest::Approx(expect).epsilon(1e-12));
  }
}

TEST_CASE("grad hook: a parameter used twice fires once, with the summed gradient") {
  Generator gen(3);
  SUBCASE("mul(w, w)") {
    VarD w = param(uniform(Shape{2, 3}, gen));
    HookLog log;
    w.set_grad_hook([&log, wv = w.value()](NodeD& n) {
      ++log.calls;
      log.grad.assign(n.grad.data(), n.grad.data() + n.grad.numel());
      for (std::int64_t i = 0; i < n.grad.numel(); ++i) CHECK(n.grad[i] == doctest::Approx(2 * wv[i]).epsilon(1e-14));
    });
    backward(sum(mul(w, w)));
    CHECK(log.calls == 1);
    CHECK(log.grad == values(w.grad()));
  }
  SUBCASE("add(w, w) and matmul(w, w)") {
    VarD w = param(uniform(Shape{3, 3}, gen));
    HookLog log;
    watch(w, log);
    backward(sum(add(matmul(w, w), add(w, w))));
    CHECK(log.calls == 1);
    CHECK(log.grad == values(w.grad()));
    // d/dW Σ(W W + 2W) = 1·Wᵀ + Wᵀ·1 + 2, with 1 the all-ones matrix.
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        double e = 2;
        for (int k = 0; k < 3; ++k) e += w.value()[j * 3 + k] + w.value()[k * 3 + i];
        CHECK(w.grad()[i * 3 + j] == doctest::Approx(e).epsilon(1e-13));
      }
  }
  SUBCASE("the same weight in two layers: linear(linear(x, w), w)") {
    VarD w = param(uniform(Shape{4, 4}, gen));
    VarD x = constant(uniform(Shape{5, 4}, gen));
    HookLog log;
    watch(w, log);
    auto f = [&x](Inputs const& in) { return sum(tanh(linear(tanh(linear(x, in[0])), in[0]))); };
    backward(f({w}));
    CHECK(log.calls == 1);
    CHECK(log.grad == values(w.grad()));
    check_grad("shared weight", f, {w});
  }
}

TEST_CASE("grad hook: several parameters each fire once per backward; one outside the graph never fires") {
  Generator gen(4);
  VarD x = constant(uniform(Shape{6, 5}, gen));
  VarD w1 = param(uniform(Shape{4, 5}, gen)), b1 = param(uniform(Shape{4}, gen));
  VarD w2 = param(uniform(Shape{3, 4}, gen)), unused = param(uniform(Shape{3}, gen));
  HookLog lw1, lb1, lw2, lu;
  watch(w1, lw1);
  watch(b1, lb1);
  watch(w2, lw2);
  watch(unused, lu);
  for (int step = 1; step <= 3; ++step) {
    for (auto const& p : {w1, b1, w2, unused}) p.zero_grad();
    backward(mean(linear(relu(linear(x, w1, b1)), w2)));
    CHECK(lw1.calls == step);
    CHECK(lb1.calls == step);
    CHECK(lw2.calls == step);
    CHECK(lw1.grad == values(w1.grad()));
    CHECK(lb1.grad == values(b1.grad()));
    CHECK(lw2.grad == values(w2.grad()));
  }
  CHECK(lu.calls == 0);
  CHECK_FALSE(unused.has_grad());
}

TEST_CASE("grad hook: a leaf root fires once; hooks go on leaves only") {
  VarD w = param(from_values<double>(Shape{1}, {3.0}));
  HookLog log;
  watch(w, log);
  backward(w);
  CHECK(log.calls == 1);
  CHECK(w.grad()[0] == 1.0);
  VarD y = scale(w, 2.0);
  CHECK_THROWS_AS(y.set_grad_hook([](NodeD&) {}), ArgumentError);
}

TEST_CASE("gradients accumulate across backward() calls until zero_grad; zero_grad then backward overwrites") {
  Generator gen(5);
  VarD w = param(uniform(Shape{3, 2}, gen));
  VarD x = constant(uniform(Shape{4, 2}, gen));
  auto loss = [&] { return sum(tanh(linear(x, w))); };
  backward(loss());
  std::vector<double> const g1 = values(clone(w.grad()));
  backward(loss());
  for (std::size_t i = 0; i < g1.size(); ++i)
    CHECK(w.grad()[static_cast<std::int64_t>(i)] == doctest::Approx(2 * g1[i]).epsilon(1e-14));
  backward(loss());
  for (std::size_t i = 0; i < g1.size(); ++i)
    CHECK(w.grad()[static_cast<std::int64_t>(i)] == doctest::Approx(3 * g1[i]).epsilon(1e-14));

  w.zero_grad();
  CHECK_FALSE(w.has_grad());
  CHECK_FALSE(w.grad().defined());
  // zero_grad keeps the storage (arena views) but the next backward must overwrite, not add: poison it.
  Tensor<double> storage = w.node().grad;
  for (std::int64_t i = 0; i < storage.numel(); ++i) storage[i] = 1e300;
  backward(loss());
  CHECK(w.node().grad.data() == storage.data());  // written in place, not reallocated
  CHECK(values(w.grad()) == g1);
}

TEST_CASE("zero_grad before the first backward, and a gradient arena view as grad storage") {
  Generator gen(6);
  VarD w = param(uniform(Shape{2, 2}, gen));
  Tensor<double> arena = full<double>(Shape{8}, -7.0);
  w.node().grad = Tensor<double>::view(arena.owner(), arena.data() + 2, Shape{2, 2});
  w.zero_grad();
  backward(sum(scale(w, 3.0)));
  CHECK(arena[0] == -7.0);
  CHECK(arena[1] == -7.0);
  for (int i = 2; i < 6; ++i) CHECK(arena[i] == 3.0);
  CHECK(arena[6] == -7.0);
  CHECK(arena[7] == -7.0);
}

TEST_CASE("NoGradGuard records nothing; backward on its result throws ddp::Error") {
  Generator gen(7);
  VarD w = param(uniform(Shape{3}, gen));
  CHECK(grad_enabled());
  {
    NoGradGuard const guard;
    CHECK_FALSE(grad_enabled());
    VarD y = sum(mul(w, w));
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    CHECK(std::string(y.op()) == "leaf");
    CHECK_THROWS_AS(backward(y), Error);
    {
      NoGradGuard const nested;
      CHECK_FALSE(grad_enabled());
    }
    CHECK_FALSE(grad_enabled());  // the inner guard restores the outer state, not "enabled"
  }
  CHECK(grad_enabled());
  CHECK(sum(mul(w, w)).requires_grad());
  CHECK_FALSE(w.has_grad());
  // Nothing requires grad: the result is a constant too, and backward says so.
  VarD c = constant(uniform(Shape{3}, gen));
  check_throws_with<ArgumentError>([&] { backward(sum(c)); }, {"does not require grad"});
}

TEST_CASE("NoGradGuard is per thread: a guard on one thread does not stop another from recording") {
  Generator gen(17);
  VarD w = param(uniform(Shape{3}, gen));
  bool other_records = false, other_sees_enabled = false;
  {
    NoGradGuard const guard;
    std::thread t([&] {
      other_sees_enabled = grad_enabled();
      other_records = mul(w, w).requires_grad();
    });
    t.join();
    CHECK_FALSE(mul(w, w).requires_grad());
  }
  CHECK(other_sees_enabled);
  CHECK(other_records);
}

TEST_CASE("backward twice through a freed graph throws; retain_graph keeps it") {
  Generator gen(8);
  SUBCASE("default frees the graph") {
    VarD w = param(uniform(Shape{2, 3}, gen));
    VarD loss = sum(mul(w, w));
    backward(loss);
    check_throws_with<Error>([&] { backward(loss); }, {"retain_graph"});
  }
  SUBCASE("retain_graph: a second backward adds the same gradient again") {
    VarD w = param(uniform(Shape{2, 3}, gen));
    HookLog log;
    watch(w, log);
    VarD loss = sum(tanh(mul(w, w)));
    backward(loss, {}, BackwardOptions{.retain_graph = true});
    CHECK(log.calls == 1);
    std::vector<double> const g1 = values(clone(w.grad()));
    backward(loss, {}, BackwardOptions{.retain_graph = true});
    for (std::size_t i = 0; i < g1.size(); ++i)
      CHECK(w.grad()[static_cast<std::int64_t>(i)] == doctest::Approx(2 * g1[i]).epsilon(1e-14));
    CHECK(log.calls == 2);  // once per backward, also through a retained graph
    CHECK(log.grad == values(w.grad()));
    backward(loss);  // the last one frees
    for (std::size_t i = 0; i < g1.size(); ++i)
      CHECK(w.grad()[static_cast<std::int64_t>(i)] == doctest::Approx(3 * g1[i]).epsilon(1e-14));
    CHECK_THROWS_AS(backward(loss), Error);
  }
  SUBCASE("retain_graph with an explicit grad_output on a non-scalar root") {
    VarD w = param(uniform(Shape{2, 3}, gen));
    VarD y = tanh(w);
    Tensor<double> const v = uniform(Shape{2, 3}, gen);
    backward(y, v, BackwardOptions{.retain_graph = true});
    std::vector<double> const g1 = values(clone(w.grad()));
    w.zero_grad();
    backward(y, v);
    CHECK(values(w.grad()) == g1);
  }
  SUBCASE("a second root that reaches a freed part of the graph") {
    VarD w = param(uniform(Shape{4}, gen));
    VarD h = tanh(w);
    VarD l1 = sum(h), l2 = mean(h);
    backward(l1);
    check_throws_with<Error>([&] { backward(l2); }, {"retain_graph"});
  }
}

TEST_CASE("an interior root keeps no stale gradient: backward(h, v) then backward(f(h)) starts from zero") {
  Generator gen(9);
  VarD w = param(uniform(Shape{5}, gen));
  VarD h = tanh(w);
  backward(h, uniform(Shape{5}, gen), BackwardOptions{.retain_graph = true});
  w.zero_grad();
  backward(sum(h));
  for (std::int64_t i = 0; i < 5; ++i) {
    double const t = std::tanh(w.value()[i]);
    CHECK(w.grad()[i] == doctest::Approx(1 - t * t).epsilon(1e-14));
  }
}

TEST_CASE("a deep chain (100000 ops) neither overflows the stack in backward nor when the graph is dropped") {
  constexpr int kDepth = 100000;
  SUBCASE("backward frees the graph") {
    VarD x = param(from_values<double>(Shape{2}, {0.5, -0.25}));
    HookLog log;
    watch(x, log);
    VarD h = x;
    for (int i = 0; i < kDepth; ++i) h = scale(h, 1.0);
    backward(sum(h));
    CHECK(log.calls == 1);
    CHECK(x.grad()[0] == 1.0);
    CHECK(x.grad()[1] == 1.0);
  }
  SUBCASE("backward with retain_graph, then the graph is dropped") {
    VarD x = param(from_values<double>(Shape{2}, {0.5, -0.25}));
    {
      VarD h = x;
      for (int i = 0; i < kDepth; ++i) h = add(h, x);
      backward(sum(h), {}, BackwardOptions{.retain_graph = true});
    }
    CHECK(x.grad()[0] == double(kDepth + 1));
  }
  SUBCASE("no backward at all: the graph is dropped as built (e.g. a forward pass without NoGradGuard)") {
    VarD x = param(from_values<double>(Shape{2}, {0.5, -0.25}));
    {
      VarD h = x;
      for (int i = 0; i < kDepth; ++i) h = tanh(h);
      CHECK(h.requires_grad());
    }
    CHECK_FALSE(x.has_grad());
  }
}

namespace {
// Runs f on a thread with a 256 KiB stack (as a rank thread might have): any recursion per node of a
// 10⁵-node graph overflows it.
template <class F>
void on_small_stack(F f) {
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, 256 * 1024) == 0);
  pthread_t t;
  REQUIRE(pthread_create(
              &t, &attr,
              [](void* arg) -> void* {
                (*static_cast<F*>(arg))();
                return nullptr;
              },
              &f) == 0);
  REQUIRE(pthread_join(t, nullptr) == 0);
  pthread_attr_destroy(&attr);
}
}  // namespace

TEST_CASE("deep chains on a small stack: building, backward, and dropping the graph use O(1) stack depth") {
  constexpr int kDepth = 100000;
  // Results are recorded here and checked on the main thread (doctest assertions are not thread-safe).
  double g_freed = 0, g_retained = 0;
  bool dropped = false;
  on_small_stack([&] {
    VarD x = param(from_values<double>(Shape{1}, {0.5}));
    {
      VarD h = x;
      for (int i = 0; i < kDepth; ++i) h = scale(h, 1.0);
      backward(sum(h));  // frees as it goes
    }
    g_freed = x.grad()[0];
    x.zero_grad();
    {
      VarD h = x;
      for (int i = 0; i < kDepth; ++i) h = mul(h, h);  // each node holds its parent twice
      backward(sum(scale(h, 0.0)), {}, BackwardOptions{.retain_graph = true});
    }  // the retained graph is dropped here
    g_retained = x.grad()[0];
    {
      VarD h = x;
      for (int i = 0; i < kDepth; ++i) h = tanh(h);
    }  // never backpropagated: dropped as built
    dropped = true;
  });
  CHECK(g_freed == 1.0);
  CHECK(g_retained == 0.0);
  CHECK(dropped);
}

TEST_CASE("backward's own errors name the shapes") {
  Generator gen(10);
  VarD w = param(uniform(Shape{2, 3}, gen));
  VarD y = tanh(w);
  check_throws_with<ShapeError>([&] { backward(y); }, {"one-element root", "[2, 3]"});
  check_throws_with<ShapeError>([&] { backward(y, uniform(Shape{3, 2}, gen)); }, {"[3, 2]", "[2, 3]"});
  check_throws_with<ArgumentError>([] { backward(VarD{}); }, {"undefined"});
}

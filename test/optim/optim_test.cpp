// optim: SGD/Adam/AdamW against PyTorch 1.13's update rules written out in double, state round trips,
// skipped parameters, schedules.
#include <doctest/doctest.h>

#include <cmath>

#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
// One parameter vector w with a fixed gradient function g(w, step) = w * 0.5 + c_i·(step+1).
struct Setup {
  Var w{from_values<float>({4}, {0.5f, -1.0f, 2.0f, 0.25f}), RequiresGrad::kYes};
  nn::ParameterArena<float> arena{std::vector<nn::NamedParameter<float, HostSpace>>{{"w", w}}};
  void set_grad(int step) {
    Tensor<float> g = w.node().grad;
    for (int i = 0; i < 4; ++i) g[i] = 0.5f * w.value()[i] + 0.1f * float(i + 1) * float(step + 1);
    w.node().grad_defined = true;
  }
};
double grad_ref(double w, int i, int step) { return 0.5 * w + 0.1 * (i + 1) * (step + 1); }
}  // namespace

TEST_CASE("SGD matches PyTorch's rule: weight decay, momentum (buffer starts as grad), dampening, nesterov") {
  for (bool nesterov : {false, true}) {
    for (double damp : {0.0, 0.3}) {
      if (nesterov && damp != 0) continue;
      CAPTURE(nesterov);
      CAPTURE(damp);
      Setup s;
      optim::SgdOptions o{.lr = 0.1, .momentum = 0.9, .dampening = damp, .weight_decay = 0.01, .nesterov = nesterov};
      optim::SGD opt(s.arena, o);
      double w[4] = {0.5, -1.0, 2.0, 0.25}, buf[4] = {};
      for (int step = 0; step < 5; ++step) {
        s.set_grad(step);
        opt.step();
        for (int i = 0; i < 4; ++i) {
          double d = grad_ref(w[i], i, step) + o.weight_decay * w[i];
          buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
          d = nesterov ? d + o.momentum * buf[i] : buf[i];
          w[i] -= o.lr * d;
          CHECK(s.w.value()[i] == doctest::Approx(w[i]).epsilon(1e-5));
        }
      }
    }
  }
}

TEST_CASE("Adam (L2) and AdamW (decoupled) match PyTorch's rules with bias correction") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    Setup s;
    double const lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.05;
    optim::Adam adam(s.arena, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
    optim::AdamW adamw(s.arena, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
    double w[4] = {0.5, -1.0, 2.0, 0.25}, m[4] = {}, v[4] = {};
    for (int step = 0; step < 6; ++step) {
      s.set_grad(step);
      if (decoupled) adamw.step(); else adam.step();
      int const t = step + 1;
      for (int i = 0; i < 4; ++i) {
        double g = grad_ref(w[i], i, step);
        if (decoupled) w[i] *= 1 - lr * wd; else g += wd * w[i];
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        double const denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
        w[i] -= lr / (1 - std::pow(b1, t)) * m[i] / denom;
        CHECK(s.w.value()[i] == doctest::Approx(w[i]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("optimizer state round trip: resuming continues bitwise identically") {
  auto run = [](bool interrupt) {
    Setup s;
    optim::AdamW opt(s.arena, {.lr = 0.02});
    for (int step = 0; step < 3; ++step) s.set_grad(step), opt.step();
    if (interrupt) {
      auto st = opt.state();
      optim::AdamW fresh(s.arena, {.lr = 0.5});  // different lr: restored from the state
      fresh.load_state(st);
      for (int step = 3; step < 6; ++step) s.set_grad(step), fresh.step();
    } else {
      for (int step = 3; step < 6; ++step) s.set_grad(step), opt.step();
    }
    std::vector<float> out(4);
    for (int i = 0; i < 4; ++i) out[i] = s.w.value()[i];
    return out;
  };
  auto a = run(false), b = run(true);
  for (int i = 0; i < 4; ++i) CHECK(a[i] == b[i]);
}

TEST_CASE("load_state rejects a mismatched state with a clear message") {
  Setup s;
  optim::SGD sgd(s.arena, {.lr = 0.1, .momentum = 0.9});
  optim::Adam adam(s.arena, {});
  CHECK_THROWS_WITH_AS(sgd.load_state(adam.state()), doctest::Contains("'adam'"), ArgumentError);
  auto st = sgd.state();
  st.buffers[0].data.pop_back();
  CHECK_THROWS_WITH_AS(sgd.load_state(st), doctest::Contains("momentum_buffer"), ArgumentError);
  CHECK_THROWS_AS(optim::SGD(s.arena, {.lr = -1}), ArgumentError);
  CHECK_THROWS_AS(optim::SGD(s.arena, {.lr = 0.1, .nesterov = true}), ArgumentError);
}

TEST_CASE("parameters without a gradient are skipped, as PyTorch skips grad=None") {
  Var a(from_values<float>({2}, {1, 2}), RequiresGrad::kYes), b(from_values<float>({2}, {3, 4}), RequiresGrad::kYes);
  nn::ParameterArena<float> arena(std::vector<nn::NamedParameter<float, HostSpace>>{{"a", a}, {"b", b}});
  optim::SGD opt(arena, {.lr = 1.0, .momentum = 0.5, .weight_decay = 0.1});
  backward(sum(a));  // only a gets a gradient
  opt.step();
  CHECK(a.value()[0] == doctest::Approx(1 - (1 + 0.1 * 1)));
  CHECK(b.value()[0] == 3.0f);
  CHECK(b.value()[1] == 4.0f);
}

TEST_CASE("StepLR and cosine annealing schedules") {
  Setup s;
  optim::SGD opt(s.arena, {.lr = 1.0});
  optim::StepLR sched(opt, {.step_size = 2, .gamma = 0.5});
  double expect[] = {1.0, 0.5, 0.5, 0.25, 0.25};
  for (double e : expect) {
    sched.step();
    CHECK(opt.lr() == doctest::Approx(e));
  }
  optim::SGD opt2(s.arena, {.lr = 0.1});
  optim::CosineAnnealingLR cos(opt2, {.t_max = 4, .eta_min = 0.0});
  cos.set_epoch(2);
  CHECK(opt2.lr() == doctest::Approx(0.05));
  cos.set_epoch(4);
  CHECK(opt2.lr() == doctest::Approx(0.0));
}

// bench/train_step: single-thread time of one training step (zero_grad, forward, loss, backward,
// optimizer) for the toy, MLP, wide and CNN models; median of many after warm-up.
//   bazel run //bench:train_step -- [toy|mlp|wide|cnn ...]
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
double median_seconds(F&& step, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    step();
    t[i] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::nth_element(t.begin(), t.begin() + iters / 2, t.end());
  return t[iters / 2];
}

Tensor<float> random_tensor(Shape s, Generator& g) {
  Tensor<float> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = g.uniform(-1.0f, 1.0f);
  return t;
}
Tensor<std::int32_t> random_labels(std::int64_t n, int classes, Generator& g) {
  Tensor<std::int32_t> t(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>(g.below(classes));
  return t;
}

template <class M, class O, class L>
double time_model(M& model, O& opt, Tensor<float> const& x, L&& loss_fn, int warmup, int iters) {
  return median_seconds(
      [&] {
        opt.zero_grad();
        Var loss = loss_fn(model(Var(x)));
        backward(loss);
        opt.step();
      },
      warmup, iters);
}

void report(char const* name, double sec, double target, char const* unit) {
  double const v = std::strcmp(unit, "us") == 0 ? sec * 1e6 : sec * 1e3;
  std::printf("%-6s %10.3f %s/step   target <= %g %s   %s\n", name, v, unit, target, unit, v <= target ? "OK" : "MISS");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> which(argv + 1, argv + argc);
  if (which.empty()) which = {"toy", "mlp", "wide", "cnn"};
  std::printf("ddp train_step benchmark: 1 thread, Eigen %d.%d.%d, SIMD: %s\n", EIGEN_WORLD_VERSION,
              EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse());
  Generator g(0);
  for (auto const& w : which) {
    if (w == "toy") {
      nn::Sequential m(nn::Linear(10, 10, g), nn::ReLU(), nn::Linear(10, 5, g));
      nn::ParameterArena p(m);
      optim::SGD opt(p, {.lr = 0.001});
      auto x = random_tensor({5, 10}, g), y = random_tensor({5, 5}, g);
      report("toy",
             time_model(
                 m, opt, x, [&](Var const& o) { return mse_loss(o, y); }, 2000, 20000),
             5, "us");
    } else if (w == "mlp") {
      nn::Sequential m(nn::Flatten(), nn::Linear(784, 256, g), nn::ReLU(), nn::Linear(256, 128, g), nn::ReLU(),
                       nn::Linear(128, 10, g));
      nn::ParameterArena p(m);
      optim::SGD opt(p, {.lr = 0.01, .momentum = 0.9});
      auto x = random_tensor({64, 1, 28, 28}, g);
      auto y = random_labels(64, 10, g);
      report("mlp",
             time_model(
                 m, opt, x, [&](Var const& o) { return cross_entropy(o, y); }, 50, 400),
             0.6, "ms");
    } else if (w == "wide") {
      nn::Sequential m(nn::Linear(10, 10000, g), nn::ReLU(), nn::Linear(10000, 10000, g), nn::ReLU(),
                       nn::Linear(10000, 5, g));
      nn::ParameterArena p(m);
      optim::SGD opt(p, {.lr = 0.001});
      auto x = random_tensor({2, 10}, g), y = random_tensor({2, 5}, g);
      report("wide",
             time_model(
                 m, opt, x, [&](Var const& o) { return mse_loss(o, y); }, 3, 15),
             120, "ms");
    } else if (w == "cnn") {
      nn::Sequential m(nn::Conv2d(1, 32, 3, g), nn::ReLU(), nn::Conv2d(32, 64, 3, g), nn::ReLU(), nn::MaxPool2d(2),
                       nn::Dropout(0.25, 1), nn::Flatten(), nn::Linear(9216, 128, g), nn::ReLU(), nn::Dropout(0.5, 2),
                       nn::Linear(128, 10, g));
      nn::ParameterArena p(m);
      optim::AdamW opt(p, {.lr = 1e-3});
      auto x = random_tensor({64, 1, 28, 28}, g);
      auto y = random_labels(64, 10, g);
      report("cnn",
             time_model(
                 m, opt, x, [&](Var const& o) { return cross_entropy(o, y); }, 5, 40),
             40, "ms");
    } else {
      std::fprintf(stderr, "unknown model '%s' (toy, mlp, wide, cnn)\n", w.c_str());
      return 2;
    }
  }
  return 0;
}

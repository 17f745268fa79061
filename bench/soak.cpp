// bench/soak: many DDP training steps of the 784-256-128-10 MLP (SGD with momentum, a fresh random batch each
// step, as a loader would give), reporting resident memory (RSS) and the mean step time per window of steps,
// to show both stay flat: no leak, no slowdown over a long run (issue 11). Rank 0 reports.
//   bazel run //bench:soak -- --world-size 2 --steps 10000           (threads)
//   mpirun -n 2 bazel-bin/bench/soak --backend mpi --steps 10000
//   bench/soak.sh: both
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

// Resident set size of this process in MiB (/proc/self/statm: pages).
double rss_mib() {
  std::ifstream f("/proc/self/statm");
  long size = 0, resident = 0;
  f >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("soak", "Long DDP run of the MLP: RSS and step time per window, start vs end.");
  examples::add_launch_flags(flags)
      .add("steps", "10000", "training steps")
      .add("window", "1000", "steps per reported window")
      .add("batch-size", "32", "per-rank batch size");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::int64_t const steps = flags.integer("steps"), window = flags.integer("window"),
                       bs = flags.integer("batch-size");
    if (steps < 1 || window < 1 || bs < 1)
      throw ArgumentError("soak: --steps, --window and --batch-size must be positive");
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      Generator init(0);
      nn::Sequential model(nn::Flatten(), nn::Linear(784, 256, init), nn::ReLU(), nn::Linear(256, 128, init),
                           nn::ReLU(), nn::Linear(128, 10, init));
      DistributedDataParallel ddp(model, comm);
      optim::SGD opt(ddp.parameters(), {.lr = 0.01, .momentum = 0.9});
      Generator data(100 + static_cast<std::uint64_t>(comm.rank()));
      Tensor<float> x(Shape{bs, 1, 28, 28});
      Tensor<std::int32_t> y(Shape{bs});
      if (comm.rank() == 0) {
        std::printf("soak: backend %s, world size %d, %lld steps, MLP 784-256-128-10, batch %lld per rank\n",
                    flags.str("backend").c_str(), comm.world_size(), static_cast<long long>(steps),
                    static_cast<long long>(bs));
        std::printf("%10s %14s %10s %12s\n", "steps", "mean step ms", "RSS MiB", "loss");
      }
      std::vector<double> window_ms, window_rss;
      auto t0 = Clock::now();
      double loss_sum = 0;
      for (std::int64_t s = 1; s <= steps; ++s) {
        for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(0.0f, 1.0f);
        for (std::int64_t i = 0; i < bs; ++i) y[i] = static_cast<std::int32_t>(data.below(10));
        opt.zero_grad();
        Var l = cross_entropy(ddp(Var(x)), y);
        backward(l);
        opt.step();
        loss_sum += static_cast<double>(l.value()[0]);
        if (s % window == 0 || s == steps) {
          auto const t1 = Clock::now();
          std::int64_t const n = s % window == 0 ? window : s % window;
          double const ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / static_cast<double>(n);
          double rss = rss_mib();
          // With the threads backend all ranks share one process: its RSS. With MPI: the largest rank's.
          comm.all_reduce(std::span(&rss, 1), ReduceOp::kMax);
          window_ms.push_back(ms);
          window_rss.push_back(rss);
          if (comm.rank() == 0) {
            std::printf("%10lld %14.3f %10.1f %12.4f\n", static_cast<long long>(s), ms, rss,
                        loss_sum / static_cast<double>(n));
            std::fflush(stdout);
          }
          loss_sum = 0;
          t0 = Clock::now();
        }
      }
      if (comm.rank() == 0 && window_ms.size() >= 2) {
        std::printf("start vs end: step %.3f -> %.3f ms (x%.3f), RSS %.1f -> %.1f MiB (%+.1f MiB)\n", window_ms.front(),
                    window_ms.back(), window_ms.back() / window_ms.front(), window_rss.front(), window_rss.back(),
                    window_rss.back() - window_rss.front());
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

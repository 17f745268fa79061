// 03_wide: the seed's wide model (Linear 10→10000, ReLU, Linear 10000→10000, ReLU, Linear 10000→5; about
// 100M parameters), batch 2 per rank, SGD, 1 MiB buckets. Run with DDP_TRACE_COLLECTIVES=1 to see one
// broadcast per parameter at construction and one all-reduce per bucket per step.
//   DDP_TRACE_COLLECTIVES=1 wide --steps 2        mpirun -n 2 wide --backend mpi
#include <chrono>
#include <cstdio>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

using namespace ddp;

int main(int argc, char** argv) {
  examples::Flags flags("wide", "The wide model (about 100M parameters) under DDP with 1 MiB buckets.");
  examples::add_launch_flags(flags)
      .add("steps", "3", "training steps")
      .add("hidden", "10000", "hidden width")
      .add("bucket-cap-mb", "1", "bucket cap in MiB");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::int64_t const steps = flags.integer("steps"), h = flags.integer("hidden");
    double const cap_mb = flags.real("bucket-cap-mb");
    if (steps < 1 || h < 1 || cap_mb < 0)
      throw ArgumentError("--steps and --hidden must be positive, --bucket-cap-mb >= 0");
    auto const cap = static_cast<std::size_t>(cap_mb * (1 << 20));
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      Generator g(0);
      nn::Sequential model(nn::named("net1", nn::Linear(10, h, g)), nn::ReLU(), nn::named("net2", nn::Linear(h, h, g)),
                           nn::ReLU(), nn::named("net3", nn::Linear(h, 5, g)));
      DistributedDataParallel ddp(
          model, comm, {},
          {.bucketer = SizeCapped{{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)}}});
      optim::SGD opt(ddp.parameters(), {.lr = 0.001});
      if (comm.rank() == 0) {
        std::printf("%s\n", ddp.describe().c_str());
        for (std::size_t b = 0; b < ddp.plan().buckets.size(); ++b) {
          std::string names;
          for (auto p : ddp.plan().buckets[b].params) names += " " + ddp.parameters().entries()[p].name;
          std::printf("  bucket %zu: %lld elements:%s\n", b, (long long)ddp.plan().buckets[b].numel, names.c_str());
        }
      }
      Generator dg(100 + static_cast<std::uint64_t>(comm.rank()));
      Tensor<float> x(Shape{2, 10}), y(Shape{2, 5});
      for (std::int64_t s = 0; s < steps; ++s) {
        for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = dg.uniform(-1.0f, 1.0f);
        for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = dg.uniform(-1.0f, 1.0f);
        auto const t0 = std::chrono::steady_clock::now();
        opt.zero_grad();
        Var loss = mse_loss(ddp(Var(x)), y);
        backward(loss);
        opt.step();
        double const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (comm.rank() == 0) std::printf("step %lld  loss %.6f  %.1f ms\n", (long long)s, loss.item(), ms);
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

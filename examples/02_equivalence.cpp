// 02_equivalence: the DDP invariant, shown. N ranks each training on B/N samples per step produce the same
// weights as one process training on all B samples (SGD with momentum, 20 steps). Prints the max
// difference; exits 1 if it exceeds 1e-6 relative to max|w|.
//   equivalence [--world-size 4]      mpirun -n 4 equivalence --backend mpi
#include <cmath>
#include <cstdio>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"
#include "examples/common/rows.hpp"

using namespace ddp;
using examples::slice_rows;

namespace {
auto make_model(std::uint64_t seed) {
  Generator g(seed);
  return nn::Sequential(nn::Linear(16, 64, g), nn::Tanh(), nn::Linear(64, 64, g), nn::ReLU(), nn::Linear(64, 4, g));
}
}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("equivalence", "N ranks on B/N samples == one process on B samples.");
  examples::add_launch_flags(flags)
      .add("batch", "32", "global batch B (divisible by the world size)")
      .add("steps", "20", "SGD steps");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::int64_t const B = flags.integer("batch"), steps = flags.integer("steps");
    // The rank body shares nothing with main or with other ranks (with the threads backend they are threads
    // of this process): each rank checks the all-reduced result itself and reports a mismatch by throwing,
    // which launch() turns into the exit code on every backend.
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      int const n = comm.world_size(), r = comm.rank();
      if (B % n != 0) throw ArgumentError(detail::cat("--batch ", B, " must be divisible by the world size ", n));
      std::int64_t const local = B / n;
      Generator dg(7);
      Tensor<float> x(Shape{B * steps, 16}), y(Shape{B * steps, 4});
      for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = dg.uniform(-1.0f, 1.0f);
      for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = dg.uniform(-1.0f, 1.0f);

      auto model = make_model(1);  // DDP: each rank its B/N share
      DistributedDataParallel ddp(model, comm);
      optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
      auto single = make_model(1);  // one process, all B samples
      nn::ParameterArena<float> sp(single);
      optim::SGD sopt(sp, {.lr = 0.05, .momentum = 0.9});
      for (std::int64_t s = 0; s < steps; ++s) {
        opt.zero_grad();
        backward(mse_loss(ddp(Var(slice_rows(x, s * B + r * local, local))), slice_rows(y, s * B + r * local, local)));
        opt.step();
        sopt.zero_grad();
        backward(mse_loss(single(Var(slice_rows(x, s * B, B))), slice_rows(y, s * B, B)));
        sopt.step();
      }
      std::vector<double> m{0.0, 0.0};  // max |w_ddp - w_single|, max |w_single|: over all ranks
      for (std::size_t i = 0; i < sp.entries().size(); ++i) {
        auto const& a = ddp.parameters().entries()[i];
        auto const& b = sp.entries()[i];
        for (std::int64_t j = 0; j < a.numel; ++j) {
          m[0] = std::max(m[0], double(std::abs(a.var.value()[j] - b.var.value()[j])));
          m[1] = std::max(m[1], double(std::abs(b.var.value()[j])));
        }
      }
      comm.all_reduce(m, ReduceOp::kMax);  // every rank now holds the same verdict
      if (r == 0) {
        std::printf("world size %d, %lld samples per rank, %lld steps: max |w_ddp - w_single| = %.3g (max|w| = %.3g)\n",
                    n, (long long)local, (long long)steps, m[0], m[1]);
      }
      if (m[0] / std::max(1.0, m[1]) > 1e-6) {
        throw Error(detail::cat("DDP weights differ from single-process weights by ", m[0], " (max|w| = ", m[1],
                                "), more than 1e-6 relative"));
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

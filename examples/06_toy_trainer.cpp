// 06_toy_trainer: the seed's ToyModel (Linear 10→10, ReLU, Linear 10→5, MSE, SGD) trained data-parallel with
// basic_trainer. Threads backend by default (2 ranks in this process); under MPI:
//   mpirun -n 4 toy_trainer --backend mpi
#include <cstdio>

#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

using namespace ddp;

int main(int argc, char** argv) {
  examples::Flags flags("toy_trainer", "ToyModel with random data, data-parallel SGD.");
  examples::add_launch_flags(flags)
      .add("epochs", "5", "passes over the data")
      .add("samples", "256", "random training samples")
      .add("batch-size", "16", "per-rank batch size");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::int64_t const n = flags.integer("samples"), epochs = flags.integer("epochs"), bs = flags.integer("batch-size");
    if (n < 1 || epochs < 1 || bs < 1) throw ArgumentError("--samples, --epochs and --batch-size must be positive");
    // The rank body shares nothing with main or with other ranks (with the threads backend they are threads
    // of this process): each rank checks the loss itself (mean_loss is averaged over ranks, so every rank sees
    // the same numbers) and reports a failure by throwing, which launch() turns into the exit code.
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      Generator data_gen(1234);  // the same dataset on every rank; the sampler splits it
      Tensor<float> x(Shape{n, 10}), y(Shape{n, 5});
      for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data_gen.uniform(-1.0f, 1.0f);
      for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = data_gen.uniform(-1.0f, 1.0f);
      TensorDataset<float> data(x, y);

      Generator init(0);
      nn::Sequential model(nn::named("net1", nn::Linear(10, 10, init)), nn::ReLU(),
                           nn::named("net2", nn::Linear(10, 5, init)));
      trainer<decltype(model), std::remove_reference_t<decltype(comm)>> t(model, comm, {.lr = 0.05, .momentum = 0.9},
                                                                          {.batch_size = bs});
      if (comm.rank() == 0) std::printf("%s\n", t.ddp().describe().c_str());
      double first = 0, last = 0;
      for (std::int64_t e = 0; e < epochs; ++e) {
        auto r =
            t.fit_epoch(data, {.epoch = e}, [](Var const& out, auto const& batch) { return mse_loss(out, batch.y); });
        if (e == 0) first = r.train.mean_loss();
        last = r.train.mean_loss();
        if (comm.rank() == 0)
          std::printf("epoch %lld  mean loss %.6f  (%lld steps, %.1f ms)\n", (long long)e, r.train.mean_loss(),
                      (long long)r.steps, r.seconds * 1e3);
      }
      if (!(last < first)) throw Error(detail::cat("the mean loss did not decrease: ", first, " -> ", last));
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

// Jobs that must fail with the same error on every rank, never hang: --mode=uneven (basic_trainer, datasets of
// different sizes: rank 0 has one batch more), --mode=early (ddp::join with throw_on_early_termination),
// --mode=nan (a NaN gradient on the last rank under NonFinite::kRaise). Each rank prints "rank R: <error>",
// the ranks meet in a barrier (a rank without the error would leave the job hanging there, failing the test),
// then the job aborts. Run by expect_every_rank.sh, which checks every rank's line.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "ddp/comm/mpi.hpp"
#include "test/parallel/join_cases.hpp"

using namespace ddp;

namespace {
void run(MpiBackend& comm, std::string const& mode) {
  int const r = comm.rank(), n = comm.world_size();
  if (mode == "uneven") {
    Generator g(3);
    std::int64_t const size = r == 0 ? 16 * n : 12 * n;
    Tensor<float> x(Shape{size, 4});
    Tensor<std::int32_t> y(Shape{size});
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < size; ++i) y[i] = static_cast<std::int32_t>(i % 3);
    TensorDataset<std::int32_t> data(x, y);
    nn::Sequential model(nn::Linear(4, 8, g), nn::ReLU(), nn::Linear(8, 3, g));
    trainer<decltype(model), MpiBackend> t(model, comm, {.lr = 0.1}, {.batch_size = 4});
    t.fit_epoch(data, {.epoch = 0}, [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); });
    return;
  }
  auto model = test::make_mlp(8, 16, 4, 1);
  bool on = mode == "nan";
  test::poison_fc2_bias(model, r, n - 1, on);
  DistributedDataParallel ddp(model, comm, {.non_finite = NonFinite::kRaise});
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  auto data = test::make_data(4, 8, 4, 1);
  join(ddp, opt,
       [&] {
         for (int s = 0; s < test::uneven_batches(r); ++s) {
           opt.zero_grad();
           backward(mse_loss(ddp(Var(data.x)), data.y));
           opt.step();
         }
       },
       {.throw_on_early_termination = true});
}
}  // namespace

int main(int argc, char** argv) {
  std::string mode = "uneven";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--mode=", 7) == 0) mode = argv[i] + 7;
  MpiSession session(argc, argv);
  MpiBackend comm(session);
  try {
    run(comm, mode);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    std::fflush(stderr);
    comm.barrier();
    session.abort(e.what());
  }
  return 0;
}

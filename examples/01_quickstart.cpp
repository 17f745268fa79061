// 01_quickstart: the training loop of 00_toy, data-parallel on 2 thread ranks (README "Data-parallel").
#include <ddp/ddp.hpp>

#include <cstdio>

int main() {
  using namespace ddp;
  spawn(2, [](ThreadsBackend& comm) {  // or MpiBackend under mpirun: the same body
    Generator gen(0);
    nn::Sequential model(nn::Linear(10, 10, gen), nn::ReLU(), nn::Linear(10, 5, gen));
    DistributedDataParallel ddp(model, comm);  // checks shapes on all ranks, broadcasts rank 0's weights
    optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});

    Generator data(1 + comm.rank());  // each rank's own shard of the batch
    Tensor<float> x(Shape{10, 10}), y(Shape{10, 5});
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = data.uniform(-1.0f, 1.0f);

    for (int step = 0; step < 50; ++step) {
      opt.zero_grad();
      Var loss = mse_loss(ddp(Var(x)), y);
      backward(loss);  // buckets are all-reduced while backward runs
      opt.step();
      if (comm.rank() == 0 && step % 10 == 0) std::printf("step %2d  rank 0 loss %.6f\n", step, loss.item());
    }
  });
}

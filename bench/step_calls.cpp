// bench/step_calls: the quickstart's training loop (examples/01_quickstart.cpp: an MLP 10-10-5 on 2 thread ranks,
// SGD with momentum) run for argv[1] steps, for step_calls.sh to count the calls one step makes.
#include <cstdio>
#include <cstdlib>

#include "ddp/ddp.hpp"

int main(int argc, char** argv) {
  using namespace ddp;
  int const steps = argc > 1 ? std::atoi(argv[1]) : 1;
  spawn(2, [&](ThreadsBackend& comm) {
    Generator gen(0);
    nn::Sequential model(nn::Linear(10, 10, gen), nn::ReLU(), nn::Linear(10, 5, gen));
    DistributedDataParallel ddp(model, comm);
    optim::SGD opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
    Generator data(1 + comm.rank());
    Tensor<float> x(Shape{10, 10}), y(Shape{10, 5});
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = data.uniform(-1.0f, 1.0f);
    for (int step = 0; step < steps; ++step) {
      opt.zero_grad();
      Var loss = mse_loss(ddp(Var(x)), y);
      backward(loss);
      opt.step();
    }
  });
}

// Consumer of ddp::mpi: every MPI rank trains a linear layer with DDP (run under mpirun).
#include <ddp/comm/mpi.hpp>
#include <ddp/ddp.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  using namespace ddp;
  MpiSession session(argc, argv);
  MpiBackend comm(session);
  Generator gen(0);
  nn::Linear model(4, 1, gen);
  DistributedDataParallel ddp(model, comm);
  optim::SGD opt(ddp.parameters(), {.lr = 0.1});
  Tensor<float> x(Shape{8, 4}), y(Shape{8, 1});
  Generator data(100 + static_cast<std::uint64_t>(comm.rank()));
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < 8; ++i) y[i] = x[4 * i] - 2 * x[4 * i + 1];
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    backward(mse_loss(ddp(Var(x)), y));
    opt.step();
  }
  if (comm.rank() == 0) std::printf("consumer mpi: %d ranks trained\n", comm.world_size());
}

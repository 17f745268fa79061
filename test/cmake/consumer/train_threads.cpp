// Consumer of ddp::ddp: two thread ranks train a linear layer with DDP; prints the final loss.
#include <ddp/ddp.hpp>

#include <cstdio>

int main() {
  using namespace ddp;
  spawn(2, [](ThreadsBackend& comm) {
    Generator gen(0);
    nn::Linear model(4, 1, gen);
    DistributedDataParallel ddp(model, comm);
    optim::SGD opt(ddp.parameters(), {.lr = 0.1});
    Generator data(100 + static_cast<std::uint64_t>(comm.rank()));
    Tensor<float> x(Shape{8, 4}), y(Shape{8, 1});
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = data.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < 8; ++i) y[i] = x[4 * i] - 2 * x[4 * i + 1];
    float first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      opt.zero_grad();
      Var loss = mse_loss(ddp(Var(x)), y);
      backward(loss);
      opt.step();
      (step == 0 ? first : last) = loss.item();
    }
    if (!(last < first)) throw Error("loss did not decrease");
    if (comm.rank() == 0) std::printf("consumer threads: loss %.4f -> %.4f\n", first, last);
  });
}

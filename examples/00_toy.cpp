// 00_toy: the smallest complete training loop — ToyModel (Linear 10→10, ReLU, Linear 10→5), MSE, SGD,
// random data — on one process. Prints the loss every 5 steps; exits non-zero if the loss did not drop.
#include <cstdio>

#include <ddp/ddp.hpp>

int main() {
  using namespace ddp;
  Generator gen(0);
  nn::Sequential model(nn::named("net1", nn::Linear(10, 10, gen)), nn::ReLU(),
                       nn::named("net2", nn::Linear(10, 5, gen)));
  nn::ParameterArena params(model);  // flat parameter/grad buffers
  optim::SGD opt(params, {.lr = 0.05, .momentum = 0.9});

  Tensor<float> x(Shape{20, 10}), y(Shape{20, 5});  // a fixed random batch
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = gen.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = gen.uniform(-1.0f, 1.0f);

  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    opt.zero_grad();
    Var loss = mse_loss(model(Var(x)), y);
    backward(loss);
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
    if (step % 10 == 0 || step == 49) std::printf("step %2d  loss %.6f\n", step, last);
  }
  return last < first ? 0 : 1;
}

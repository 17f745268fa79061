// The main job's two models, BasicNet (a CNN) and a 784-256-128-10 MLP, over any memory space: the same
// definition trains on host tensors and on device tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "ddp/ddp.hpp"

namespace ddp::examples {

// The model and handles to its dropout layers' generators (shared with the layers).
template <MemorySpace S = HostSpace>
struct Net {
  nn::AnySequential<float, S> seq;
  std::vector<nn::basic_dropout<float, S>> dropouts;
};

// BasicNet (PyTorch's MNIST example): conv 1→32 3×3, ReLU, conv 32→64 3×3, ReLU, max-pool 2, dropout 0.25,
// flatten, fc 9216→128, ReLU, dropout 0.5, fc 128→10. 1,199,882 parameters. Input (N, 1, 28, 28).
template <MemorySpace S = HostSpace>
Net<S> make_cnn(Generator& gen) {
  Net<S> n;
  n.dropouts = {nn::basic_dropout<float, S>(0.25), nn::basic_dropout<float, S>(0.5)};
  n.seq.push_back("conv1", nn::basic_conv2d<float, S>(1, 32, 3, gen)).push_back(nn::basic_relu<float, S>());
  n.seq.push_back("conv2", nn::basic_conv2d<float, S>(32, 64, 3, gen)).push_back(nn::basic_relu<float, S>());
  n.seq.push_back(nn::basic_max_pool2d<float, S>(2)).push_back(n.dropouts[0]).push_back(nn::basic_flatten<float, S>());
  n.seq.push_back("fc1", nn::basic_linear<float, S>(9216, 128, gen))
      .push_back(nn::basic_relu<float, S>())
      .push_back(n.dropouts[1]);
  n.seq.push_back("fc2", nn::basic_linear<float, S>(128, 10, gen));
  return n;
}

// 784-256-128-10 with ReLU. 235,146 parameters. Input (N, 1, 28, 28) or (N, 784).
template <MemorySpace S = HostSpace>
Net<S> make_mlp(Generator& gen) {
  Net<S> n;
  n.seq.push_back(nn::basic_flatten<float, S>());
  n.seq.push_back("fc1", nn::basic_linear<float, S>(784, 256, gen)).push_back(nn::basic_relu<float, S>());
  n.seq.push_back("fc2", nn::basic_linear<float, S>(256, 128, gen)).push_back(nn::basic_relu<float, S>());
  n.seq.push_back("fc3", nn::basic_linear<float, S>(128, 10, gen));
  return n;
}

inline std::uint64_t mix(std::uint64_t x) { return ddp::detail::mix64(x); }  // splitmix64's finaliser

// Dropout masks depend only on (seed, rank, epoch, step, layer): each step reseeds the generators, so a run
// resumed from a checkpoint draws the same masks as one never interrupted. Ranks differ (seed + rank). Host and
// device tensors draw the same masks (the device takes the same PCG32 stream by jump-ahead).
template <MemorySpace S>
void reseed_dropouts(Net<S>& net, std::int64_t seed, int rank, std::int64_t epoch, std::int64_t step) {
  for (std::size_t k = 0; k < net.dropouts.size(); ++k)
    net.dropouts[k].generator().seed(
        static_cast<std::uint64_t>(seed + rank),
        mix(mix(static_cast<std::uint64_t>(epoch)) ^ static_cast<std::uint64_t>(step) * 131 ^ k));
}

}  // namespace ddp::examples

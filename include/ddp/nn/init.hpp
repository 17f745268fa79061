// PyTorch's default initialisations, drawn from ddp's portable Generator.
#pragma once

#include <cmath>

#include "ddp/tensor/random.hpp"
#include "ddp/tensor/tensor.hpp"

namespace ddp::nn::init {

// uniform(-bound, bound) in place (host tensor).
template <class T>
void uniform(Tensor<T>& t, double bound, Generator& gen) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = gen.uniform<T>(T(-bound), T(bound));
}

// kaiming_uniform_(a = sqrt(5)), PyTorch's default for Linear/Conv weights: bound = gain·sqrt(3/fan_in)
// with gain = sqrt(2/(1+a²)) = sqrt(1/3), i.e. bound = 1/sqrt(fan_in).
template <class T>
void kaiming_uniform_default(Tensor<T>& w, std::int64_t fan_in, Generator& gen) {
  double const a = std::sqrt(5.0), gain = std::sqrt(2.0 / (1.0 + a * a));
  uniform(w, fan_in > 0 ? gain * std::sqrt(3.0 / double(fan_in)) : 0.0, gen);
}

// PyTorch's default bias init: uniform(±1/sqrt(fan_in)).
template <class T>
void bias_default(Tensor<T>& b, std::int64_t fan_in, Generator& gen) {
  uniform(b, fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0, gen);
}

// normal(mean, std) in place (host tensor): torch.nn.init.normal_, as GPT-style models initialise.
template <class T>
void normal(Tensor<T>& t, double mean, double std, Generator& gen) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(mean + std * gen.normal());
}

}  // namespace ddp::nn::init

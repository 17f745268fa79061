// evaluate(): classification accuracy and loss of a model over a dataset, split across ranks, each sample
// counted exactly once (EvalSampler; integer counts summed exactly), whatever wraps the model for training.
#pragma once

#include <concepts>
#include <cstdint>

#include "ddp/autograd/autograd.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/data/dataset.hpp"
#include "ddp/data/loader.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/nn/module.hpp"

namespace ddp {

// Runs `model` in Mode::kEval without autograd on this rank's EvalSampler share of `data` and sums the counts
// over the ranks of `comm` (one all-reduce, so ranks with one batch more or less stay in step). The model is
// left in Mode::kTrain.
template <nn::Model M, Communicator C, Dataset D>
requires std::same_as<typename D::target_type, std::int32_t> Counts evaluate(M& model, C& comm, D const& data,
                                                                             std::int64_t batch_size = 256) {
  using S = typename M::space;
  using V = Variable<typename M::value_type, S>;
  EvalSampler sampler(data.size(), comm);
  DataLoader loader(data, sampler, {.batch_size = batch_size, .drop_last = false});
  model.set_mode(Mode::kEval);
  NoGradGuard ng;
  Counts c;
  for (auto const& batch : loader) {
    V out = model.forward(V(to_space<S>(batch.x)));
    c.add_batch(argmax_correct(to_space<HostSpace>(out.value()), batch.y), batch.size(),
                cross_entropy(out, to_space<S>(batch.y)).item());
  }
  model.set_mode(Mode::kTrain);
  return all_reduce_counts(comm, c);
}

}  // namespace ddp

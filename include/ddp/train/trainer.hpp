// basic_trainer<Model, Comm, Optimizer, Bucketer>: the standard data-parallel loop (sampler per epoch,
// DDP forward/backward, optimizer step, exact distributed evaluation) for users who do not want to
// write it. The explicit loop stays available: trainer.ddp() and trainer.optimizer() are the pieces.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "ddp/data/loader.hpp"
#include "ddp/data/metrics.hpp"
#include "ddp/data/sampler.hpp"
#include "ddp/optim/optimizer.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"

namespace ddp {

struct TrainerOptions {
  std::int64_t batch_size = 32;  // per rank
  bool shuffle = true;
  std::uint64_t seed = 0;  // sampler seed (the shuffle is the same on every rank)
  bool drop_last = true;   // drop each epoch's incomplete last batch (DataLoader's drop_last)
  DdpOptions ddp{};
};

struct EpochResult {
  std::int64_t epoch = 0;
  std::int64_t steps = 0;
  double mean_loss = 0;  // over ranks and steps (each step's mean loss, averaged)
  double seconds = 0;
};

// Per-step callback: (epoch, step, steps_in_epoch, this rank's loss).
using StepCallback = std::function<void(std::int64_t, std::int64_t, std::int64_t, double)>;

template <nn::Model M, AsyncCommunicator C, optim::Optimizer O, GradientBucketer B = SizeCapped>
class basic_trainer {
 public:
  using S = typename M::space;
  using V = Variable<typename M::value_type, S>;

  basic_trainer(M& model, C& comm, typename O::options_type opt, TrainerOptions opts = {}, B bucketer = {})
      : comm_(&comm), opts_(opts), ddp_(model, comm, opts.ddp, std::move(bucketer)), opt_(ddp_.parameters(), opt) {
    if (opts.batch_size < 1)
      throw ArgumentError(detail::cat("trainer: batch_size must be positive, got ", opts.batch_size));
  }

  // One epoch over `data` (each rank its DistributedSampler share). loss(output, batch) -> scalar Var. Batches
  // are host tensors; each input is copied to the model's space (loss gets the host batch: copy its targets with
  // to_space<S> for a device model).
  template <Dataset D, class LossFn>
  EpochResult fit_epoch(D const& data, std::int64_t epoch, LossFn&& loss, StepCallback const& on_step = {}) {
    auto const t0 = std::chrono::steady_clock::now();
    DistributedSampler sampler(data.size(), *comm_, {.shuffle = opts_.shuffle, .seed = opts_.seed, .drop_last = false});
    sampler.set_epoch(epoch);
    DataLoader loader(data, sampler, {.batch_size = opts_.batch_size, .drop_last = opts_.drop_last});
    ddp_.module().set_mode(Mode::kTrain);
    std::vector<double> sum{0.0};
    std::int64_t step = 0;
    std::int64_t const steps = loader.num_batches();
    for (auto const& batch : loader) {
      opt_.zero_grad();
      V l = loss(ddp_(V(to_space<S>(batch.x))), batch);
      backward(l);
      opt_.step();
      double const lv = l.item();
      sum[0] += lv;
      if (on_step) on_step(epoch, step, steps, lv);
      ++step;
    }
    host_all_reduce(*comm_, std::span<double>(sum), ReduceOp::kAvg);
    return {epoch, steps, steps ? sum[0] / double(steps) : 0.0,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  }

  // Classification accuracy over `data`, each sample counted exactly once across ranks (EvalSampler).
  template <Dataset D>
  requires std::same_as<typename D::target_type, std::int32_t> Counts evaluate(D const& data,
                                                                               std::int64_t batch_size = 256) {
    EvalSampler sampler(data.size(), *comm_);
    DataLoader loader(data, sampler, {.batch_size = batch_size, .drop_last = false});
    ddp_.module().set_mode(Mode::kEval);
    NoGradGuard ng;
    Counts c;
    for (auto const& batch : loader) {
      V out = ddp_.module().forward(V(to_space<S>(batch.x)));
      c.add_batch(argmax_correct(to_space<HostSpace>(out.value()), batch.y), batch.size(),
                  cross_entropy(out, to_space<S>(batch.y)).item());
    }
    ddp_.module().set_mode(Mode::kTrain);
    return all_reduce_counts(*comm_, c);
  }

  DistributedDataParallel<M, C, B>& ddp() noexcept { return ddp_; }
  O& optimizer() noexcept { return opt_; }
  C& comm() noexcept { return *comm_; }

 private:
  C* comm_;
  TrainerOptions opts_;
  DistributedDataParallel<M, C, B> ddp_;
  O opt_;
};

// The common composition: SGD and PyTorch's default bucketing.
template <nn::Model M, AsyncCommunicator C>
using trainer = basic_trainer<M, C, optim::basic_sgd<typename M::value_type, typename M::space>>;

}  // namespace ddp

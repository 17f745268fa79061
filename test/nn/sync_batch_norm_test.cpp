// SyncBatchNorm2d and convert_sync_batchnorm on the threads backend: equivalence with BatchNorm2d over the
// global batch (a different batch size on each rank), under DDP, the converter, and the errors.
#include <doctest/doctest.h>

#include <vector>

#include "test/nn/sync_batch_norm_cases.hpp"

using namespace ddp;
using test::sbn::BatchSplit;

static_assert(nn::Model<nn::SyncBatchNorm2d<ThreadsBackend>>);
static_assert(nn::Model<nn::basic_sync_batch_norm2d<Recording<ThreadsBackend>, double>>);
static_assert(BatchStatsExchange<nn::detail::CommStatsExchange<ThreadsBackend>>);
static_assert(!BatchStatsExchange<ThreadsBackend>);  // a communicator is bound through the layer, not passed raw
static_assert(
    std::same_as<nn::with_sync_batchnorm_t<nn::BatchNorm2d, ThreadsBackend>, nn::SyncBatchNorm2d<ThreadsBackend>>);
static_assert(std::same_as<nn::with_sync_batchnorm_t<nn::Linear, ThreadsBackend>, nn::Linear>);

namespace {
std::vector<int> const kWorlds{1, 2, 3, 4};
std::vector<BatchSplit> const kSplits{BatchSplit::kRankPlusOne, BatchSplit::kTwoRankPlusOne,
                                      BatchSplit::kNoneOnRankOne};

template <class T>
void run_layer_equivalence(double bound) {
  for (int n : kWorlds)
    for (BatchSplit split : kSplits) {
      CAPTURE(n);
      CAPTURE(test::sbn::name(split));
      test::sbn::LayerDiffs d;
      spawn(n, [&](ThreadsBackend& comm) {
        auto const mine = test::sbn::layer_equivalence<T>(comm, split);
        if (comm.rank() == 0) d = mine;
      });
      MESSAGE("world ", n, ", ", test::sbn::name(split), ": ", d.str());
      CHECK(d.max() <= bound);
    }
}
}  // namespace

TEST_CASE(
    "SyncBatchNorm2d (float) with r+1, 2r+1 or no samples on rank 1 equals BatchNorm2d over the global batch in "
    "double") {
  run_layer_equivalence<float>(2e-6);
}

TEST_CASE("SyncBatchNorm2d in double equals BatchNorm2d over the global batch to rounding") {
  run_layer_equivalence<double>(1e-12);
}

TEST_CASE(
    "statistics of values far from zero (mean 1e6, spread 1) stay exact: moments are merged, not sums of squares") {
  // Σx² − N·mean² would lose about 1e12·1e-16 = 1e-4 of the variance here; the merged M2 keeps it to rounding.
  for (int n : {2, 4}) {
    test::sbn::LayerDiffs d;
    spawn(n, [&](ThreadsBackend& comm) {
      auto const mine = test::sbn::layer_equivalence<double>(comm, BatchSplit::kTwoRankPlusOne, 2, 1e6);
      if (comm.rank() == 0) d = mine;
    });
    MESSAGE("world ", n, ", offset 1e6: ", d.str());
    CHECK(d.max() <= 1e-9);
  }
}

TEST_CASE("sync_batch_norm2d at one rank (the op itself, no fallback) equals batch_norm2d") {
  spawn(1, [](ThreadsBackend& comm) {
    auto const xs = test::sbn::global_input(5, 3, 2, 2, 7);
    Variable<double> x1(clone(xs), RequiresGrad::kYes), x2(clone(xs), RequiresGrad::kYes);
    nn::basic_batch_norm2d<double> a(3), b(3);
    auto const w = Variable<double>(test::sbn::uniform(xs.shape(), 8));
    backward(sum(mul(batch_norm2d(x1, a.weight, a.bias, a.running_mean, a.running_var, Mode::kTrain), w)));
    backward(sum(mul(sync_batch_norm2d(x2, b.weight, b.bias, b.running_mean, b.running_var, Mode::kTrain,
                                       nn::detail::CommStatsExchange<ThreadsBackend>(comm)),
                     w)));
    test::sbn::Diff d;
    d.add(x2.grad().data(), x1.grad().data(), xs.numel());
    d.add(b.weight.grad().data(), a.weight.grad().data(), 3);
    d.add(b.running_var.data(), a.running_var.data(), 3);
    test::sbn::expect(d.rel() <= 1e-12, "op at one rank differs from batch_norm2d by " + std::to_string(d.rel()));
  });
}

TEST_CASE("DDP over a converted model with a different batch size per rank equals one process on the global batch") {
  for (int n : kWorlds)
    for (BatchSplit split : {BatchSplit::kRankPlusOne, BatchSplit::kTwoRankPlusOne})
      for (bool broadcast : {true, false}) {
        CAPTURE(n);
        CAPTURE(test::sbn::name(split));
        CAPTURE(broadcast);
        test::sbn::DdpDiffs d;
        spawn(n, [&](ThreadsBackend& comm) {
          auto const mine = test::sbn::ddp_equivalence(comm, split, {.broadcast_buffers = broadcast});
          if (comm.rank() == 0) d = mine;
        });
        MESSAGE("world ", n, ", ", test::sbn::name(split), ", broadcast_buffers ", broadcast, ": ", d.str());
        CHECK(d.max() <= 2e-6);
      }
}

TEST_CASE(
    "convert_sync_batchnorm: Sequential becomes the Sequential of converted types, names kept, parameters shared") {
  spawn(2, [](ThreadsBackend& comm) {
    using test::sbn::expect;
    Generator g(3);
    using Block = nn::Sequential<nn::BatchNorm2d, nn::ReLU>;
    nn::Sequential<nn::Named<nn::Conv2d>, nn::Named<nn::BatchNorm2d>, nn::ReLU, nn::Named<Block>> model(
        nn::named("conv", nn::Conv2d(2, 3, 3, g, {.padding = 1})),
        nn::named("bn", nn::BatchNorm2d(3, {.momentum = 0.3, .eps = 1e-3})), nn::ReLU(),
        nn::named("block", Block(nn::BatchNorm2d(3), nn::ReLU())));
    auto synced = nn::convert_sync_batchnorm(model, comm);
    using Sbn = nn::SyncBatchNorm2d<ThreadsBackend>;
    static_assert(std::same_as<decltype(synced), nn::Sequential<nn::Named<nn::Conv2d>, nn::Named<Sbn>, nn::ReLU,
                                                                nn::Named<nn::Sequential<Sbn, nn::ReLU>>>>);
    expect(synced.get<1>().options().momentum == 0.3 && synced.get<1>().options().eps == 1e-3, "options carried over");
    auto const pa = model.named_parameters(), pb = synced.named_parameters();
    expect(pa.size() == pb.size() && pa.size() == 6, "parameter count");
    for (std::size_t i = 0; i < pa.size(); ++i)
      expect(pa[i].name == pb[i].name && pa[i].var.node_ptr() == pb[i].var.node_ptr(),
             "parameter " + pa[i].name + " not shared");
    auto const ba = model.named_buffers(), bb = synced.named_buffers();
    expect(ba.size() == 4 && bb.size() == 4, "buffer count");
    for (std::size_t i = 0; i < ba.size(); ++i)
      expect(ba[i].name == bb[i].name && ba[i].tensor.data() == bb[i].tensor.data(),
             "buffer " + ba[i].name + " not shared");
    expect(bb[0].name == "bn.running_mean" && bb[2].name == "block.0.running_mean", "buffer names");
    // The same batch on both ranks: the global statistics are each rank's, so outputs equal the original's.
    auto const xs = test::sbn::converted<float>(test::sbn::global_input(3, 2, 4, 4, 11));
    auto const y1 = synced(Var(xs)), y0 = model(Var(xs));
    test::sbn::Diff d;
    d.add(y1.value().data(), y0.value().data(), y0.numel());
    expect(d.abs <= 1e-5, "converted model's output differs by " + std::to_string(d.abs));
    // Modes come over: an evaluation-mode model converts to an evaluation-mode model.
    model.set_mode(Mode::kEval);
    auto evald = nn::convert_sync_batchnorm(model, comm);
    expect(evald.mode() == Mode::kEval && evald.get<1>().mode() == Mode::kEval &&
               evald.get<3>().get<0>().mode() == Mode::kEval,
           "modes carried over");
  });
}

TEST_CASE("convert_sync_batchnorm looks into AnySequential and type-erased layers, recursively") {
  spawn(2, [](ThreadsBackend& comm) {
    using test::sbn::expect;
    using Sbn = nn::SyncBatchNorm2d<ThreadsBackend>;
    Generator g(4);
    nn::AnySequential<> inner;
    inner.push_back(nn::BatchNorm2d(3)).push_back(nn::ReLU());
    nn::AnySequential<> model;
    model.push_back("conv", nn::Conv2d(2, 3, 3, g, {.padding = 1}))
        .push_back("bn", nn::BatchNorm2d(3))
        .push_back("relu", nn::ReLU())
        .push_back("block", inner);
    auto synced = nn::convert_sync_batchnorm(model, comm);
    static_assert(std::same_as<decltype(synced), nn::AnySequential<>>);
    expect(synced.size() == 4 && synced.name_at(3) == "block", "entries and names");
    expect(synced.layer_at(0).target<nn::Conv2d>() != nullptr && synced.layer_at(1).target<Sbn>() != nullptr &&
               synced.layer_at(2).target<nn::ReLU>() != nullptr,
           "layer types after conversion");
    auto const* block = synced.layer_at(3).target<nn::AnySequential<>>();
    expect(block && block->layer_at(0).target<Sbn>() != nullptr && block->layer_at(1).target<nn::ReLU>() != nullptr,
           "nested AnySequential converted");
    auto const pa = model.named_parameters(), pb = synced.named_parameters();
    expect(pa.size() == pb.size(), "parameter count");
    for (std::size_t i = 0; i < pa.size(); ++i)
      expect(pa[i].name == pb[i].name && pa[i].var.node_ptr() == pb[i].var.node_ptr(),
             "parameter " + pa[i].name + " not shared");
    auto const xs = test::sbn::converted<float>(test::sbn::global_input(3, 2, 4, 4, 12));
    auto const y1 = synced(Var(xs)), y0 = model(Var(xs));
    test::sbn::Diff d;
    d.add(y1.value().data(), y0.value().data(), y0.numel());
    expect(d.abs <= 1e-5, "converted model's output differs by " + std::to_string(d.abs));
    // A lone BatchNorm2d converts to a SyncBatchNorm2d; anything else comes back as it was.
    static_assert(std::same_as<decltype(nn::convert_sync_batchnorm(nn::BatchNorm2d(2), comm)), Sbn>);
    nn::Linear lin(2, 2, g);
    expect(nn::convert_sync_batchnorm(lin, comm).weight.node_ptr() == lin.weight.node_ptr(), "Linear unchanged");
  });
}

TEST_CASE("a rank with a different channel count is a DdpError on every rank naming both counts, never a hang") {
  for (int n : {2, 3}) spawn(n, [](ThreadsBackend& comm) { test::sbn::channel_mismatch(comm); });
}

TEST_CASE("one value per channel over all ranks is a ShapeError on every rank") {
  for (int n : {2, 4}) spawn(n, [](ThreadsBackend& comm) { test::sbn::too_few_values(comm); });
}

TEST_CASE("bad input shapes are local ShapeErrors, raised before any collective") {
  for (int n : {1, 2}) spawn(n, [](ThreadsBackend& comm) { test::sbn::bad_input_shapes(comm); });
}

// Local SGD, post-local SGD and DiLoCo (parallel/local_sgd.hpp) on the threads backend at 1, 2 and 4 ranks: the
// scenarios of local_sgd_cases.hpp, micro-batches, and bad options.
#include <doctest/doctest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "test/parallel/local_sgd_cases.hpp"

namespace local_sgd_test {

using namespace ddp;

TEST_CASE("LocalSgd: local steps send nothing, every period-th step averages the replicas") {
  for (int n : {1, 2, 4}) spawn(n, [](ThreadsBackend& comm) { test::local_sgd_matches_replicas(comm, 3, 0, 7); });
}

TEST_CASE("LocalSgd: post-local SGD is a plain DDP for the warm-up steps, then local") {
  spawn(2, [](ThreadsBackend& comm) { test::local_sgd_matches_replicas(comm, 2, 3, 8); });
  spawn(2, [](ThreadsBackend& comm) {  // the README's form
    auto model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    LocalSgd<optim::SGD, ThreadsBackend> local(ddp,
                                               {.optimizer = {.lr = 0.1}, .local = {.period = 8, .warmup_steps = 2}});
    CHECK(!local.local_round());
    CHECK(local.local_options().period == 8);
  });
}

TEST_CASE("LocalSgd: average_optimizer_state makes the momentum the same on every rank") {
  spawn(2, [](ThreadsBackend& comm) { test::local_sgd_averages_state(comm); });
}

TEST_CASE("DiLoCo: the outer Nesterov step on the averaged pseudo-gradient, every period-th step") {
  for (int n : {1, 2, 4}) spawn(n, [](ThreadsBackend& comm) { test::diloco_matches_replicas(comm, 3, 7); });
}

TEST_CASE("DiLoCo: a 16-bit pseudo-gradient sends half the bytes and stays within its rounding of the float one") {
  spawn(2, [](ThreadsBackend& comm) {
    int const n = comm.world_size(), r = comm.rank();
    auto const data = test::make_data(6 * n * 4, 8, 4, 47);
    auto run = [&](PseudoGradient wire) {
      auto model = test::make_mlp(8, 16, 4, 5);
      Recording<ThreadsBackend> rec(comm);
      DistributedDataParallel<test::Mlp, Recording<ThreadsBackend>> ddp(model, rec);
      DiLoCo<optim::SGD, Recording<ThreadsBackend>> opt(
          ddp, {.optimizer = {.lr = 0.05}, .outer = {.period = 3, .wire = wire}});
      rec.clear();
      for (int s = 0; s < 6; ++s) {
        opt.zero_grad();
        backward(mse_loss(ddp(Var(test::rows(data.x, (s * n + r) * 4, 4))), test::rows(data.y, (s * n + r) * 4, 4)));
        opt.step();
      }
      Dtype dtype = Dtype::kFloat32;
      for (auto const& c : rec.records())
        if (c.tag.label == "average") dtype = c.dtype;
      return std::tuple{test::weights(ddp.parameters()), opt.bytes_sent(), dtype};
    };
    auto const [f32, f32_bytes, f32_type] = run(PseudoGradient::kFloat);
    auto const [bf16, bf16_bytes, bf16_type] = run(PseudoGradient::kBf16);
    auto const [fp16, fp16_bytes, fp16_type] = run(PseudoGradient::kFp16);
    CHECK(f32_type == Dtype::kFloat32);
    CHECK(bf16_type == Dtype::kBFloat16);
    CHECK(fp16_type == Dtype::kFloat16);
    CHECK(bf16_bytes * 2 == f32_bytes);
    CHECK(fp16_bytes * 2 == f32_bytes);
    double const d_bf16 = test::local_rel_diff(bf16, f32), d_fp16 = test::local_rel_diff(fp16, f32);
    CHECK(d_bf16 > 0);  // it did round
    CHECK(d_bf16 < 1e-2);
    CHECK(d_fp16 < 1e-3);
  });
}

TEST_CASE("LocalSgd: a local step under MicroBatches steps on the rank's mean gradient") {
  spawn(2, [](ThreadsBackend& comm) {
    int const n = comm.world_size(), r = comm.rank();
    auto const data = test::make_data(8 * n, 8, 4, 37);
    Tensor<float> const x = test::rows(data.x, r * 8, 8), y = test::rows(data.y, r * 8, 8);
    auto m1 = test::make_mlp(8, 16, 4, 5), m2 = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, AverageAllReduce, MicroBatches> micro(
        m1, comm, {}, {.batching = {.count = 4 * n}});
    DistributedDataParallel<test::Mlp, ThreadsBackend> whole(m2, comm);
    LocalSgd<optim::SGD, ThreadsBackend> a(micro, {.optimizer = {.lr = 0.1}, .local = {.period = 5}});
    LocalSgd<optim::SGD, ThreadsBackend> b(whole, {.optimizer = {.lr = 0.1}, .local = {.period = 5}});
    a.zero_grad();
    for (auto const& mb : micro.micro_batches(x, y)) backward(mse_loss(micro(mb), mb.y));
    a.step();
    b.zero_grad();
    backward(mse_loss(whole(Var(x)), y));
    b.step();
    CHECK(test::local_rel_diff(test::weights(micro.parameters()), test::weights(whole.parameters())) < 1e-6);
  });
}

TEST_CASE("LocalSgd: each bucket's average is a span on the timeline's communication lane") {
  spawn(2, [](ThreadsBackend& comm) {
    int const n = comm.world_size(), r = comm.rank();
    auto const data = test::make_data(8 * n, 8, 4, 43);
    auto model = test::make_mlp(8, 16, 4, 5);
    Timeline timeline(r);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(
        model, comm, {.timeline = &timeline}, {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 128}}});
    LocalSgd<optim::SGD, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 0.1}, .local = {.period = 2}});
    for (int s = 0; s < 2; ++s) {
      opt.zero_grad();
      backward(mse_loss(ddp(Var(test::rows(data.x, (s * n + r) * 4, 4))), test::rows(data.y, (s * n + r) * 4, 4)));
      opt.step();
    }
    std::vector<std::string> averages;
    for (auto const& span : timeline.spans())
      if (span.name.rfind("average bucket ", 0) == 0 && span.lane == Timeline::kComm) averages.push_back(span.name);
    REQUIRE(averages.size() == ddp.plan().buckets.size());
    auto const& b0 = ddp.plan().buckets[0];
    CHECK(averages[0] == detail::cat("average bucket 0 (", b0.numel * 4, " bytes)"));
  });
}

// Rank 0's result of `f(comm)` on `n` thread ranks.
template <class F>
auto on_ranks(int n, F f) {
  decltype(f(std::declval<ThreadsBackend&>())) out{};
  spawn(n, [&](ThreadsBackend& comm) {
    auto v = f(comm);
    if (comm.rank() == 0) out = std::move(v);
  });
  return out;
}

TEST_CASE("Hierarchical local SGD: averages within nodes every 2 steps, over all ranks every 6") {
  spawn(
      4, [](ThreadsBackend& comm) { test::local_sgd_hierarchical(comm); }, ThreadsOptions{.ranks_per_node = 2});
  spawn(4, [](ThreadsBackend& comm) { test::local_sgd_hierarchical(comm); });  // one node: every average is global
  spawn(
      2, [](ThreadsBackend& comm) { test::local_sgd_hierarchical(comm); }, ThreadsOptions{.ranks_per_node = 1});
  CHECK_THROWS_WITH_AS(spawn(
                           4, [](ThreadsBackend&) {}, ThreadsOptions{.ranks_per_node = 3}),
                       "ThreadsOptions::ranks_per_node must be 0 or divide the world size (4), got 3", ArgumentError);
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    using L = LocalSgd<optim::SGD, ThreadsBackend>;
    CHECK_THROWS_WITH_AS(L(ddp, {.local = {.period = 4, .node_period = 4}}),
                         "LocalSgd: node_period must be in [1, period = 4) (0: no averages within nodes), got 4",
                         ArgumentError);
  });
}

TEST_CASE("Virtual replicas: the README's form, two of the four replicas on each of two ranks") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DeterministicDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm, {}, {.batching = {.count = 8}});
    DiLoCo<optim::AdamW, ThreadsBackend> opt(ddp, {.optimizer = {.lr = 1e-3}, .outer = {.period = 50, .replicas = 4}});
    CHECK(opt.local_replicas() == 2);
    CHECK(opt.describe().find("4 virtual replicas (2 on this rank), averaged exactly") != std::string::npos);
  });
}

TEST_CASE("Virtual replicas: the replicas trained by hand, at 1, 2 and 4 ranks") {
  for (bool diloco : {false, true})
    for (int n : {1, 2, 4}) spawn(n, [&](ThreadsBackend& comm) { test::virtual_replicas_match_hand(comm, diloco); });
}

TEST_CASE("Virtual replicas: bitwise the same replicas, optimizer state and weights at 1, 2 and 4 ranks") {
  for (bool diloco : {false, true}) {
    CAPTURE(diloco);
    auto run = [&](ThreadsBackend& comm) {
      return test::virtual_replicas_run(comm, diloco, true, 0, test::kVirtualSteps);
    };
    auto const one = on_ranks(1, run);
    REQUIRE(!one.empty());
    CHECK(on_ranks(2, run) == one);
    CHECK(on_ranks(4, run) == one);
  }
}

TEST_CASE("Virtual replicas: a checkpoint taken mid-period at 2 ranks resumes at 4 (and 4 at 1) bitwise") {
  auto const dir = std::filesystem::temp_directory_path();
  for (bool diloco : {false, true}) {
    CAPTURE(diloco);
    auto const whole = on_ranks(2, [&](ThreadsBackend& comm) {
      return test::virtual_replicas_run(comm, diloco, true, 0, test::kVirtualSteps);
    });
    auto const file = dir / (diloco ? "ddp_virtual_diloco.ckpt" : "ddp_virtual_local_sgd.ckpt");
    // Step 4: LocalSgd is one step into its second period, DiLoCo one step after its first outer step.
    (void)on_ranks(
        2, [&](ThreadsBackend& comm) { return test::virtual_replicas_run(comm, diloco, true, 0, 4, {}, file); });
    CHECK(on_ranks(4, [&](ThreadsBackend& comm) {
            return test::virtual_replicas_run(comm, diloco, true, 4, test::kVirtualSteps, file);
          }) == whole);
    (void)on_ranks(
        4, [&](ThreadsBackend& comm) { return test::virtual_replicas_run(comm, diloco, true, 0, 5, {}, file); });
    CHECK(on_ranks(1, [&](ThreadsBackend& comm) {
            return test::virtual_replicas_run(comm, diloco, true, 5, test::kVirtualSteps, file);
          }) == whole);
    std::filesystem::remove(file);
  }
}

TEST_CASE(
    "Virtual replicas in basic_trainer: each replica's mean gradient clipped before its step, the same bits at 1, 2, "
    "4") {
  auto const data = test::make_data(64, 8, 4, 61);
  TensorDataset<float> const set(data.x, data.y);
  auto run = [&](int n, std::optional<double> clip) {
    return on_ranks(n, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 16, 4, 5);
      using Opt = DiLoCo<optim::SGD, ThreadsBackend>;
      basic_trainer<test::Mlp, ThreadsBackend, Opt, SizeCapped, ExactSum, MicroBatches> t(
          model, comm, {.optimizer = {.lr = 0.5}, .outer = {.period = 3, .replicas = 4}},
          {.global_batch = 16, .clip_grad_norm = clip}, {.batching = {.count = 8}});
      for (std::int64_t e = 0; e < 2; ++e)
        t.fit_epoch(set, EpochStart{.epoch = e}, [](auto const& out, auto const& b) { return mse_loss(out, b.y); });
      if (clip) REQUIRE(t.last_grad_norm() > *clip);  // it did clip (a replica's norm, before clipping)
      return t.ddp().module().named_parameters().empty() ? std::vector<float>{}
                                                         : t.optimizer().local_state().values.front().front();
    });
  };
  auto const clipped = run(1, 0.01), unclipped = run(1, std::nullopt);
  REQUIRE(!clipped.empty());
  CHECK(clipped != unclipped);
  CHECK(run(2, 0.01) == clipped);
  CHECK(run(4, 0.01) == clipped);
}

TEST_CASE("LocalSgd and DiLoCo: a checkpoint keeps every rank's replica and resumes bitwise at the same world size") {
  auto const file = std::filesystem::temp_directory_path() / "ddp_local_sgd_per_rank.ckpt";
  using Trainer = basic_trainer<test::Mlp, ThreadsBackend, DiLoCo<optim::SGD, ThreadsBackend>>;
  auto const data = test::make_data(64, 8, 4, 59);
  TensorDataset<float> const set(data.x, data.y);
  auto run = [&](int epochs, bool resume, bool save) {
    return on_ranks(2, [&](ThreadsBackend& comm) {
      auto model = test::make_mlp(8, 16, 4, 5);
      Trainer t(model, comm, {.optimizer = {.lr = 0.05}, .outer = {.period = 3}}, {.global_batch = 8});
      std::int64_t first = 0;
      if (resume) first = t.load_checkpoint(file).epoch;
      for (std::int64_t e = first; e < epochs; ++e)
        t.fit_epoch(set, EpochStart{.epoch = e}, [](auto const& out, auto const& b) { return mse_loss(out, b.y); });
      if (save) t.save_checkpoint(file, {.epoch = epochs});
      // every rank's replica (they differ between outer steps: 8 steps an epoch, an outer step every 3)
      std::vector<float> w = test::weights(t.ddp().parameters()), all(w.size() * 2);
      host_all_gather(comm, std::span<float const>(w), std::span<float>(all));
      return all;
    });
  };
  auto const whole = run(2, false, false);
  (void)run(1, false, true);
  CHECK(run(2, true, false) == whole);
  // At another world size one replica per rank has nowhere to go: refused by name, on every rank.
  spawn(4, [&](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Trainer t(model, comm, {.optimizer = {.lr = 0.05}, .outer = {.period = 3}}, {.global_batch = 8});
    CHECK_THROWS_WITH_AS(t.load_checkpoint(file), doctest::Contains("holds the replicas of 2 ranks and this run has 4"),
                         ArgumentError);
  });
  std::filesystem::remove(file);
}

TEST_CASE("LocalSgd and DiLoCo: bad options are refused by name") {
  spawn(1, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DistributedDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm);
    using L = LocalSgd<optim::SGD, ThreadsBackend>;
    using D = DiLoCo<optim::SGD, ThreadsBackend>;
    CHECK_THROWS_WITH_AS(L(ddp, {.local = {.period = 0}}), "LocalSgd: period must be at least 1 step, got 0",
                         ArgumentError);
    CHECK_THROWS_WITH_AS(L(ddp, {.local = {.warmup_steps = -1}}), "LocalSgd: warmup_steps must be >= 0, got -1",
                         ArgumentError);
    CHECK_THROWS_WITH_AS(D(ddp, {.outer = {.period = -3}}), "DiLoCo: period must be at least 1 step, got -3",
                         ArgumentError);
    CHECK_THROWS_WITH_AS(D(ddp, {.outer = {.outer_lr = 0}}), "DiLoCo: outer_lr must be positive, got 0", ArgumentError);
    CHECK_THROWS_WITH_AS(D(ddp, {.outer = {.outer_momentum = 1.0}}), "DiLoCo: outer_momentum must be in [0, 1), got 1",
                         ArgumentError);
    CHECK_THROWS_WITH_AS(L(ddp, {.local = {.replicas = -1}}),
                         "LocalSgd: replicas must be >= 0 (0: one replica per rank), got -1", ArgumentError);
    CHECK_THROWS_WITH_AS(L(ddp, {.local = {.replicas = 2}}), doctest::Contains("virtual replicas are exact through"),
                         ArgumentError);
  });
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DeterministicDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm, {}, {.batching = {.count = 4}});
    using L = LocalSgd<optim::SGD, ThreadsBackend>;
    using D = DiLoCo<optim::SGD, ThreadsBackend>;
    CHECK_THROWS_WITH_AS(L(ddp, {}), doctest::Contains("declare virtual replicas"), ArgumentError);
    CHECK_THROWS_WITH_AS(
        L(ddp, {.local = {.replicas = 3}}),
        "LocalSgd: 3 virtual replicas cannot be shared by 2 ranks: the world size must divide replicas", ArgumentError);
    CHECK_THROWS_WITH_AS(
        D(ddp, {.outer = {.replicas = 8}}),
        "DiLoCo: 8 virtual replicas need the step's micro-batches (4, MicroBatches) to be a multiple of 8",
        ArgumentError);
    CHECK_THROWS_WITH_AS(D(ddp, {.outer = {.wire = PseudoGradient::kBf16, .replicas = 2}}),
                         doctest::Contains("a 16-bit pseudo-gradient would round it"), ArgumentError);
    L ok(ddp, {.local = {.replicas = 4}});  // two replicas on each rank, one micro-batch each
    CHECK(ok.local_replicas() == 2);
  });
}

}  // namespace local_sgd_test

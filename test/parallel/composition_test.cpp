// The composition rules (parallel/composition.hpp), one test case per rule of kCompositionRules: the real
// composition is built on two thread ranks, and what it raises on every rank is exactly composition_refusal()'s
// message for it. Then compositions that hold: nothing refused. The README's table of the rules is checked against
// kCompositionRules by //test/parallel:composition_table_test.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "test/parallel/zero_cases.hpp"

namespace composition_test {

using namespace ddp;
using Owner = DistributedDataParallel<test::Mlp, ThreadsBackend, SizeCapped, OwnerReduce>;
using Plain = DistributedDataParallel<test::Mlp, ThreadsBackend>;
using Zero = ZeroRedundancyOptimizer<optim::SGD, ThreadsBackend>;

// What `f` raises (an ArgumentError), or "" when it raises nothing.
template <class F>
std::string raised(F&& f) {
  try {
    f();
  } catch (ArgumentError const& e) {
    return e.what();
  }
  return "";
}

// The refusal the rules write for `c` ("" when they write none).
inline std::string refusal(Composition const& c) { return composition_refusal(c).value_or(""); }

inline HookTraits zero_traits(Capabilities caps) { return {.name = "ZeroRedundancyOptimizer", .caps = caps}; }
inline HookTraits reader(std::string name) {
  return {.name = std::move(name), .caps = Capability::kNeedsWholeGradients};
}
inline auto const kSharded = Capabilities(Capability::kShardsState);
inline auto const kOwner = Capability::kReducesGradients | Capability::kShardsState;

TEST_CASE("composition rule one-join: a join inside a join") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Plain ddp(model, comm);
    HookTraits const j = detail::join_traits();
    std::string const want = refusal({.ddp = ddp.composition(), .attached = std::span(&j, 1), .attaching = &j});
    REQUIRE(want.find("already inside a join") != std::string::npos);
    CHECK(raised([&] { join(ddp, [&] { join(ddp, [] {}); }); }) == want);
  });
}

TEST_CASE("composition rule join-sharded: ddp::join with a sharded optimizer, attached either way") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Plain ddp(model, comm);
    HookTraits const j = detail::join_traits(), z = zero_traits(kSharded);
    std::string const join_then_zero =
        refusal({.ddp = ddp.composition(), .attached = std::span(&j, 1), .attaching = &z});
    std::string const zero_then_join =
        refusal({.ddp = ddp.composition(), .attached = std::span(&z, 1), .attaching = &j});
    REQUIRE(!join_then_zero.empty());
    CHECK(join_then_zero == zero_then_join);
    {
      Zero opt(ddp, {.optimizer = {.lr = 0.1}});
      CHECK(raised([&] { join(ddp, [] {}); }) == zero_then_join);
      CHECK(raised([&] { join(ddp, opt, [] {}); }) == zero_then_join);
    }
    CHECK(raised([&] { join(ddp, [&] { Zero inside(ddp, {.optimizer = {.lr = 0.1}}); }); }) == join_then_zero);
    // One rank: nothing is sharded across ranks, so a join composes.
    CHECK(refusal({.ddp = {.reduction = "AverageAllReduce", .world = 1}, .attached = std::span(&z, 1), .attaching = &j})
              .empty());
  });
}

TEST_CASE("composition rule one-owner: two optimizers reducing one OwnerReduce DDP") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Owner ddp(model, comm);
    HookTraits const z = zero_traits(kOwner);
    std::string const want = refusal({.ddp = ddp.composition(), .attached = std::span(&z, 1), .attaching = &z});
    REQUIRE(want.find("already has an optimizer that reduces its gradients") != std::string::npos);
    Zero first(ddp, {.optimizer = {.lr = 0.1}});
    CHECK(raised([&] { Zero second(ddp, {.optimizer = {.lr = 0.1}}); }) == want);
  });
}

TEST_CASE("composition rule owner-unsharded: ZeRO stage 0 reducing an OwnerReduce DDP") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Owner ddp(model, comm);
    HookTraits const z = zero_traits(Capability::kReducesGradients);
    std::string const want = refusal({.ddp = ddp.composition(), .attaching = &z});
    REQUIRE(want.find("which needs stage 1 or 2") != std::string::npos);
    CHECK(raised([&] { Zero zero(ddp, {.zero = {.stage = 0}}); }) == want);
  });
}

TEST_CASE("composition rule owner-non-finite: OwnerReduce with a non-finite check") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    std::string const want = refusal(
        {.ddp = {.reduction = OwnerReduce{}.name(), .reduces_gradients = false, .non_finite = NonFinite::kRaise}});
    REQUIRE(want.find("no reduced gradients to check") != std::string::npos);
    CHECK(raised([&] { Owner ddp(model, comm, {.non_finite = NonFinite::kRaise}); }) == want);
  });
}

TEST_CASE("composition rule owner-missing: an OwnerReduce DDP stepped without a reducing optimizer") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    Owner ddp(model, comm);
    std::string const want = refusal({.ddp = ddp.composition(), .opening_round = true});
    REQUIRE(want.find("no optimizer reduces them") != std::string::npos);
    auto data = test::make_data(8, 8, 4, 3);
    CHECK(raised([&] { ddp(Var(test::rows(data.x, 4 * comm.rank(), 4))); }) == want);
  });
}

TEST_CASE("composition rule whole-overlapped: clipping or loss scaling with an update inside backward") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    using Trainer = basic_trainer<test::Mlp, ThreadsBackend, OverlappedOptimizer<optim::SGD>>;
    HookTraits const overlapped{.name = "OverlappedOptimizer", .caps = Capability::kUpdatesInBackward};
    for (std::string what : {"clip_grad_norm", "loss_scaling"}) {
      HookTraits const r = reader(what);
      std::string const want = refusal({.ddp = {.reduction = "AverageAllReduce", .world = 2},
                                        .attached = std::span(&overlapped, 1),
                                        .attaching = &r});
      REQUIRE(want.find(what + " needs every gradient before any parameter moves") != std::string::npos);
      TrainerOptions opts{.global_batch = 8};
      if (what == "clip_grad_norm")
        opts.clip_grad_norm = 1.0;
      else
        opts.loss_scaling = optim::GradScalerOptions{};
      CHECK(raised([&] { Trainer t(model, comm, {.optimizer = {.lr = 0.1}}, opts); }) == want);
    }
    // GradScaler on its own meets the same rule through the optimizer.
    Plain ddp(model, comm);
    OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1}});
    REQUIRE(opt.updates_in_backward());
    optim::GradScaler scaler(ddp.parameters());
    HookTraits const g = reader("GradScaler");
    CHECK(raised([&] { scaler.step(opt); }) ==
          refusal({.ddp = ddp.composition(), .attached = std::span(&overlapped, 1), .attaching = &g}));
  });
}

TEST_CASE("composition rule whole-owner: clipping or loss scaling under OwnerReduce") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    using Trainer = basic_trainer<test::Mlp, ThreadsBackend, Zero, SizeCapped, OwnerReduce>;
    HookTraits const z = zero_traits(kOwner), r = reader("clip_grad_norm");
    std::string const want =
        refusal({.ddp = {.reduction = OwnerReduce{}.name(), .reduces_gradients = false, .world = 2},
                 .attached = std::span(&z, 1),
                 .attaching = &r});
    REQUIRE(want.find("clip_grad_norm reads the averaged gradients before the step") != std::string::npos);
    CHECK(raised([&] { Trainer t(model, comm, {}, {.global_batch = 8, .clip_grad_norm = 1.0}); }) == want);
  });
}

TEST_CASE("composition rule local-alone: local rounds with a hook that takes rounds, attached either way") {
  spawn(2, [](ThreadsBackend& comm) {
    using Local = LocalSgd<optim::SGD, ThreadsBackend>;
    HookTraits const l{.name = "LocalSgd", .caps = Capability::kLocalRounds},
        z = zero_traits(kSharded), o{.name = "OverlappedOptimizer", .caps = Capability::kUpdatesInBackward};
    auto model = test::make_mlp(8, 16, 4, 5);
    {  // ZeRO after local SGD
      Plain ddp(model, comm);
      std::string const want = refusal({.ddp = ddp.composition(), .attached = std::span(&l, 1), .attaching = &z});
      REQUIRE(want.find("LocalSgd runs local steps in which nothing is reduced") != std::string::npos);
      Local local(ddp, {.optimizer = {.lr = 0.1}});
      CHECK(raised([&] { Zero zero(ddp, {.optimizer = {.lr = 0.1}}); }) == want);
      CHECK(raised([&] { Local second(ddp, {.optimizer = {.lr = 0.1}}); }) ==
            refusal({.ddp = ddp.composition(), .attached = std::span(&l, 1), .attaching = &l}));
    }
    {  // DiLoCo after an update in backward
      Plain ddp(model, comm);
      HookTraits const d{.name = "DiLoCo", .caps = Capability::kLocalRounds};
      std::string const want = refusal({.ddp = ddp.composition(), .attached = std::span(&o, 1), .attaching = &d});
      REQUIRE(want.find("does not compose with OverlappedOptimizer") != std::string::npos);
      OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1}});
      CHECK(raised([&] { DiLoCo<optim::SGD, ThreadsBackend> diloco(ddp, {.optimizer = {.lr = 0.1}}); }) == want);
    }
    {  // with loss scaling (basic_trainer's reader of whole gradients); clipping goes through the local rounds
      HookTraits const s{.name = "loss_scaling", .caps = Capability::kNeedsWholeGradients};
      Plain ddp(model, comm);
      std::string const want = refusal({.ddp = ddp.composition(), .attached = std::span(&l, 1), .attaching = &s});
      REQUIRE(want.find("does not compose with loss_scaling") != std::string::npos);
      using Trainer = basic_trainer<test::Mlp, ThreadsBackend, Local>;
      auto own = test::make_mlp(8, 16, 4, 5), other = test::make_mlp(8, 16, 4, 5);
      CHECK(raised([&] {
              Trainer t(own, comm, {}, {.global_batch = 8, .loss_scaling = optim::GradScalerOptions{}});
            }) == want);
      Trainer clipped(other, comm, {}, {.global_batch = 8, .clip_grad_norm = 1.0});  // composes
    }
    {  // under OwnerReduce
      Owner ddp(model, comm);
      std::string const want = refusal({.ddp = ddp.composition(), .attaching = &l});
      REQUIRE(want.find("does not compose with OwnerReduce") != std::string::npos);
      CHECK(raised([&] { Local local(ddp, {.optimizer = {.lr = 0.1}}); }) == want);
    }
  });
}

TEST_CASE("composition rule local-exact: deterministic mode takes local rounds with virtual replicas only") {
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    DeterministicDataParallel<test::Mlp, ThreadsBackend> ddp(model, comm, {}, {.batching = {.count = 2}});
    HookTraits const l{.name = "LocalSgd", .caps = Capability::kLocalRounds};
    std::string const want = refusal({.ddp = ddp.composition(), .attaching = &l});
    REQUIRE(want.find("declare virtual replicas") != std::string::npos);
    CHECK(raised([&] { LocalSgd<optim::SGD, ThreadsBackend> local(ddp, {.optimizer = {.lr = 0.1}}); }) == want);
    LocalSgd<optim::SGD, ThreadsBackend> exact(ddp, {.optimizer = {.lr = 0.1}, .local = {.replicas = 2}});
    CHECK(exact.traits().caps.has(Capability::kVirtualReplicas));
  });
  spawn(2, [](ThreadsBackend& comm) {  // and virtual replicas only in deterministic mode
    auto model = test::make_mlp(8, 16, 4, 5);
    Plain ddp(model, comm);
    HookTraits const v{.name = "DiLoCo", .caps = Capability::kLocalRounds | Capability::kVirtualReplicas};
    std::string const want = refusal({.ddp = ddp.composition(), .attaching = &v});
    REQUIRE(want.find("virtual replicas are exact through deterministic mode") != std::string::npos);
    CHECK(raised([&] {
            DiLoCo<optim::SGD, ThreadsBackend> diloco(ddp, {.optimizer = {.lr = 0.1}, .outer = {.replicas = 2}});
          }) == want);
  });
}

TEST_CASE("composition: every rule has its test case above, and what composes is not refused") {
  std::set<std::string> ids;
  for (auto const& rule : kCompositionRules) CHECK(ids.insert(std::string(rule.id)).second);
  CHECK(ids == std::set<std::string>{"one-join", "join-sharded", "one-owner", "owner-unsharded", "owner-non-finite",
                                     "owner-missing", "whole-overlapped", "whole-owner", "local-alone", "local-exact"});
  spawn(2, [](ThreadsBackend& comm) {
    auto model = test::make_mlp(8, 16, 4, 5);
    {  // OwnerReduce with its ZeRO-1 optimizer, overlapped; a plain DDP with ZeRO-1, the overlapped update and a join
      Owner owner(model, comm);
      OverlappedOptimizer<Zero> opt(owner, {.optimizer = {.optimizer = {.lr = 0.1}}});
      CHECK(opt.updates_in_backward());
    }
    auto model2 = test::make_mlp(8, 16, 4, 5);
    Plain ddp(model2, comm);
    OverlappedOptimizer<optim::SGD> opt(ddp, {.optimizer = {.lr = 0.1}});
    CHECK(raised([&] { join(ddp, opt, [] {}); }).empty());
    // Clipping with the update in step().
    using Trainer = basic_trainer<test::Mlp, ThreadsBackend, OverlappedOptimizer<optim::SGD>>;
    auto model3 = test::make_mlp(8, 16, 4, 5);
    CHECK(raised([&] {
            Trainer t(model3, comm, {.optimizer = {.lr = 0.1}, .overlap = {.update_at = UpdateAt::kStep}},
                      {.global_batch = 8, .clip_grad_norm = 1.0});
          }).empty());
    // Local SGD in the trainer, with clipping (each rank clips its own gradients in a local step).
    using LocalTrainer = basic_trainer<test::Mlp, ThreadsBackend, LocalSgd<optim::SGD, ThreadsBackend>>;
    auto model4 = test::make_mlp(8, 16, 4, 5);
    CHECK(raised([&] {
            LocalTrainer t(model4, comm, {.optimizer = {.lr = 0.1}, .local = {.period = 4}},
                           {.global_batch = 8, .clip_grad_norm = 1.0});
          }).empty());
  });
}

}  // namespace composition_test

// DistributedDataParallel over device tensors (Thrust's CPU system) on the threads backend, which takes device
// memory when the device system's memory is host-accessible: N ranks on B/N equal one process on B, and equal
// the same training on host tensors; the same model through the HostStaging adapter; unused parameters and
// no_sync on device models; ZeRO-1, the overlapped update and GradScaler on device tensors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"
#include "ddp/train/checkpoint.hpp"
#include "test/parallel/ddp_device_cases.hpp"

using namespace ddp;

using namespace ddp::test::device;

TEST_CASE("ThreadsBackend takes device memory on the CPU device system; MpiBackend-style host-only lists do not") {
  static_assert(ThreadsBackend::accepted_spaces::contains<DeviceSpace>);
  static_assert(!SpaceList<HostSpace>::contains<DeviceSpace>);
  static_assert(HostStaging<ThreadsBackend>::accepted_spaces::contains<DeviceSpace>);
  static_assert(AsyncCommunicator<HostStaging<ThreadsBackend>>);
  spawn(2, [](ThreadsBackend& comm) {
    Tensor<float, Dev> t(Shape{5});
    Kernels<Dev>::fill(5, float(comm.rank() + 1), t.data());
    comm.all_reduce(t.span(), ReduceOp::kSum);
    auto v = host_values(t);
    for (float e : v) CHECK(e == 3.0f);
  });
}

TEST_CASE("device tensors: N ranks on B/N equal one process on B, and the host run, after 20 SGD-momentum steps") {
  std::int64_t const B = 16;
  int const steps = 20;
  auto data = test::make_data(B * steps, 8, 4, 99);
  auto const host = host_reference(data, B, steps);
  for (int n : {1, 2, 4}) {
    for (BucketConfig cfg : {BucketConfig{}, BucketConfig{.cap_bytes = 256, .first_cap_bytes = 64}}) {
      CAPTURE(n);
      CAPTURE(cfg.cap_bytes);
      std::vector<std::vector<float>> w(n);
      spawn(n, [&](ThreadsBackend& comm) { w[comm.rank()] = device_ddp(comm, data, B, steps, cfg); });
      for (int r = 0; r < n; ++r) {
        CHECK(w[r] == w[0]);                  // bitwise the same on every rank
        CHECK(rel_diff(w[r], host) <= 1e-6);  // and the host single-process run
      }
    }
  }
}

// DDP weights after `steps` SGD-momentum steps over tensors of space S with reduction policy R; with `zero` 1 the
// optimizer is ZeroRedundancyOptimizer's (its state sharded); with UpdateAt::kBucketReduced each bucket is updated
// as it lands (OverlappedOptimizer). `state`, when given, receives the optimizer's whole state (consolidated).
template <MemorySpace S, class R>
std::vector<float> policy_run(ThreadsBackend& comm, test::Data const& data, std::int64_t global_batch, int steps,
                              R reduction = {}, int zero = 0, optim::OptimizerState<float>* state = nullptr,
                              UpdateAt update = UpdateAt::kStep, DdpOptions ddp_opts = {}) {
  int const n = comm.world_size(), r = comm.rank();
  std::int64_t const local = global_batch / n;
  auto model = make_mlp<S>(8, 32, 4, 1);
  DistributedDataParallel<decltype(model), ThreadsBackend, SizeCapped, R> ddp(
      model, comm, ddp_opts,
      {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 64}}, .reduction = reduction});
  using Sgd = optim::basic_sgd<float, S>;
  OverlappedOptimizer<ZeroRedundancyOptimizer<Sgd, ThreadsBackend>> opt(
      ddp, {.optimizer = {.optimizer = {.lr = 0.05, .momentum = 0.9}, .zero = {.stage = zero}},
            .overlap = {.update_at = update}});
  for (int s = 0; s < steps; ++s) {
    std::int64_t const base = s * global_batch + r * local;
    opt.zero_grad();
    auto x = to_space<S>(test::rows(data.x, base, local));
    auto y = to_space<S>(test::rows(data.y, base, local));
    backward(mse_loss(ddp(Variable<float, S>(x)), y));
    opt.step();
  }
  if (state) *state = opt.consolidated_state();
  return weights(ddp.parameters());
}

TEST_CASE(
    "device tensors: ZeRO-1 and 2, the overlapped update, static_graph and OwnerReduce give the unsharded weights and "
    "state bit for bit, alone and composed") {
  std::int64_t const B = 16;
  int const steps = 6;
  auto data = test::make_data(B * steps, 8, 4, 99);
  PowerSgd const psgd{{.rank = 2, .warmup_steps = 2, .min_compression_rate = 1.0}};
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      auto same = [&](auto reduction) {
        optim::OptimizerState<float> sharded, whole, overlapped, both;
        auto const a = policy_run<Dev>(comm, data, B, steps, reduction, 1, &sharded);
        auto const b = policy_run<Dev>(comm, data, B, steps, reduction, 0, &whole);
        auto const o = policy_run<Dev>(comm, data, B, steps, reduction, 0, &overlapped, UpdateAt::kBucketReduced);
        auto const z = policy_run<Dev>(comm, data, B, steps, reduction, 1, &both, UpdateAt::kBucketReduced);
        auto const h = policy_run<HostSpace>(comm, data, B, steps, reduction, 1);
        optim::OptimizerState<float> frozen, second;  // and all of it with the status words kept on the device
        auto const f = policy_run<Dev>(comm, data, B, steps, reduction, 1, &frozen, UpdateAt::kBucketReduced,
                                       {.static_graph = true});
        auto const t = policy_run<Dev>(comm, data, B, steps, reduction, 2, &second, UpdateAt::kBucketReduced);
        return a == b && sharded == whole && o == b && overlapped == whole && z == b && both == whole &&
               rel_diff(a, h) <= 1e-5 && f == b && frozen == whole && t == b && second == whole;
      };
      CHECK(same(AverageAllReduce{}));
      CHECK(same(Bf16AllReduce{}));
      CHECK(same(psgd));
      // OwnerReduce: the ZeRO optimizer averages its own slices from every rank's device gradients.
      optim::OptimizerState<float> whole, owned1, owned2;
      auto const b = policy_run<Dev>(comm, data, B, steps, AverageAllReduce{}, 0, &whole);
      auto const o1 = policy_run<Dev>(comm, data, B, steps, OwnerReduce{}, 1, &owned1);
      auto const o2 = policy_run<Dev>(comm, data, B, steps, OwnerReduce{}, 2, &owned2, UpdateAt::kBucketReduced);
      CHECK(o1 == b);
      CHECK(owned1 == whole);
      CHECK(o2 == b);
      CHECK(owned2 == whole);
    });
  }
}

TEST_CASE_TEMPLATE("device tensors: buckets compressed to 16 bits train as the host run with the same policy", R,
                   Bf16AllReduce, Fp16AllReduce) {
  std::int64_t const B = 16;
  int const steps = 10;
  auto data = test::make_data(B * steps, 8, 4, 99);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<float>> dev(n), host(n), plain(n);
    spawn(n, [&](ThreadsBackend& comm) {
      dev[comm.rank()] = policy_run<Dev, R>(comm, data, B, steps);
      host[comm.rank()] = policy_run<HostSpace, R>(comm, data, B, steps);
      plain[comm.rank()] = policy_run<Dev, AverageAllReduce>(comm, data, B, steps);
    });
    for (int r = 0; r < n; ++r) {
      CHECK(dev[r] == dev[0]);  // bitwise the same on every rank
      CHECK(rel_diff(dev[r], host[r]) <= 1e-6);
    }
    if (n > 1) CHECK(dev[0] != plain[0]);  // the buckets were rounded on the way
  }
}

TEST_CASE("device tensors: PowerSGD buckets train as the host run with the same policy") {
  std::int64_t const B = 16;
  int const steps = 10;
  auto data = test::make_data(B * steps, 8, 4, 99);
  PowerSgd const psgd{{.rank = 2, .warmup_steps = 3, .min_compression_rate = 1.0}};
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<float>> dev(n), host(n), plain(n);
    spawn(n, [&](ThreadsBackend& comm) {
      dev[comm.rank()] = policy_run<Dev>(comm, data, B, steps, psgd);
      host[comm.rank()] = policy_run<HostSpace>(comm, data, B, steps, psgd);
      plain[comm.rank()] = policy_run<Dev, AverageAllReduce>(comm, data, B, steps);
    });
    for (int r = 0; r < n; ++r) {
      CHECK(dev[r] == dev[0]);  // bitwise the same on every rank
      CHECK(rel_diff(dev[r], host[r]) <= 1e-5);
    }
    if (n > 1) CHECK(dev[0] != plain[0]);  // the gradients were compressed
  }
}

TEST_CASE("device tensors through HostStaging<ThreadsBackend> train as through the backend itself") {
  std::int64_t const B = 8;
  int const steps = 5;
  auto data = test::make_data(B * steps, 8, 4, 7);
  std::vector<std::vector<float>> direct(2), staged(2);
  spawn(2, [&](ThreadsBackend& comm) {
    direct[comm.rank()] = device_ddp(comm, data, B, steps);
    HostStaging<ThreadsBackend> st(comm);
    staged[comm.rank()] = device_ddp(st, data, B, steps);
  });
  CHECK(direct[0] == staged[0]);
  CHECK(direct[1] == staged[1]);
}

TEST_CASE("device tensors: an unused parameter is an error on every rank; find_unused_parameters averages") {
  // extra only on rank 0: the other ranks' forward stops at fc1.
  using Branchy = test::BasicBranchy<Dev>;
  spawn(2, [](ThreadsBackend& comm) {
    Generator g(5);
    Branchy model(g);
    model.use_extra = comm.rank() == 0;
    Variable<float, Dev> x(to_space<Dev>(full<float>({2, 4}, 1.0f)));
    {
      DistributedDataParallel ddp(model, comm);
      bool threw = false;
      try {
        backward(sum(ddp(x)));
      } catch (DdpError const& e) {
        threw = std::string(e.what()).find("'extra.weight'") != std::string::npos;
      }
      CHECK(threw);
    }
    DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true});
    ddp.parameters().zero_grad();
    backward(sum(ddp(x)));
    CHECK(host_values(ddp.parameters().find("extra.bias").var.grad())[0] == doctest::Approx(1.0f));  // 2 / world
  });
}

TEST_CASE("device tensors: no_sync accumulation then one synced step equals one big batch") {
  spawn(2, [](ThreadsBackend& comm) {
    int const r = comm.rank();
    auto data = test::make_data(8, 8, 4, 3);
    auto model = make_mlp<Dev>(8, 16, 4, 3);
    DistributedDataParallel ddp(model, comm);
    ddp.parameters().zero_grad();
    for (int m = 0; m < 2; ++m) {
      std::int64_t const base = (m * 2 + r) * 2;
      auto step = [&] {
        auto x = to_space<Dev>(test::rows(data.x, base, 2));
        backward(scale(mse_loss(ddp(Variable<float, Dev>(x)), to_space<Dev>(test::rows(data.y, base, 2))), 0.5f));
      };
      if (m == 0) {
        auto guard = ddp.no_sync();
        step();
      } else {
        step();
      }
    }
    auto ref = make_mlp<HostSpace>(8, 16, 4, 3);
    nn::ParameterArena<float> rp(ref);
    backward(mse_loss(ref(Var(data.x)), data.y));
    for (std::size_t i = 0; i < rp.entries().size(); ++i) {
      auto a = host_values(ddp.parameters().entries()[i].var.grad());
      auto b = host_values(rp.entries()[i].var.grad());
      double d = 0;
      for (std::size_t j = 0; j < a.size(); ++j) d = std::max(d, double(std::abs(a[j] - b[j])));
      CHECK(d <= 1e-6);
    }
  });
}

TEST_CASE("device tensors: a small CNN under DDP (1, 2, 4 ranks) equals one host process on the global batch") {
  for (int n : {1, 2, 4}) {
    std::vector<double> d(n);
    spawn(n, [&](ThreadsBackend& comm) { d[comm.rank()] = cnn_equivalence(comm); });
    for (double x : d) CHECK(x <= 1e-6);
  }
}

TEST_CASE("device tensors: basic_trainer trains a device model as it trains the host one, and evaluates exactly") {
  Generator g(1);
  std::int64_t const n = 96;
  Tensor<float> x(Shape{n, 4});
  Tensor<std::int32_t> y(Shape{n});
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(g.below(3));
    for (int j = 0; j < 4; ++j) x[i * 4 + j] = g.uniform(-0.5f, 0.5f) + (j == y[i] ? 1.5f : 0.0f);
  }
  TensorDataset<std::int32_t> data(x, y);
  std::vector<std::vector<float>> w(2);
  std::vector<std::vector<float>> host_w(2);
  std::vector<Counts> counts(2);
  spawn(2, [&](ThreadsBackend& comm) {
    auto dm = make_mlp<Dev>(4, 16, 3, 11);
    trainer<decltype(dm), ThreadsBackend> t(dm, comm, {.lr = 0.1, .momentum = 0.9}, {.batch_size = 8, .seed = 3});
    auto ce = [](Variable<float, Dev> const& out, auto const& batch) {
      return cross_entropy(out, to_space<Dev>(batch.y));
    };
    for (int e = 0; e < 2; ++e) t.fit_epoch(data, {.epoch = e}, ce);
    w[comm.rank()] = weights(t.ddp().parameters());
    counts[comm.rank()] = t.evaluate(data);

    auto hm = make_mlp<HostSpace>(4, 16, 3, 11);
    trainer<decltype(hm), ThreadsBackend> ht(hm, comm, {.lr = 0.1, .momentum = 0.9}, {.batch_size = 8, .seed = 3});
    auto hce = [](Var const& out, auto const& batch) { return cross_entropy(out, batch.y); };
    for (int e = 0; e < 2; ++e) ht.fit_epoch(data, {.epoch = e}, hce);
    host_w[comm.rank()] = weights(ht.ddp().parameters());
  });
  CHECK(w[0] == w[1]);
  CHECK(rel_diff(w[0], host_w[0]) <= 1e-6);
  CHECK(counts[0].total == n);
  CHECK(counts[0].correct == counts[1].correct);
  CHECK(counts[0].accuracy() > 0.8);
}

TEST_CASE("device tensors: a checkpoint (weights, AdamW moments, position) resumes the uninterrupted run bitwise") {
  char const* tmp = std::getenv("TEST_TMPDIR");
  std::filesystem::path const file = std::filesystem::path(tmp ? tmp : "/tmp") / "ddp_device_checkpoint.bin";
  auto data = test::make_data(16 * 6, 8, 4, 5);
  std::vector<std::vector<float>> straight(2), resumed(2);
  spawn(2, [&](ThreadsBackend& comm) {
    int const r = comm.rank();
    auto step = [&](auto& ddp, auto& opt, int s) {
      opt.zero_grad();
      auto x = to_space<Dev>(test::rows(data.x, s * 16 + r * 8, 8));
      backward(mse_loss(ddp(Variable<float, Dev>(x)), to_space<Dev>(test::rows(data.y, s * 16 + r * 8, 8))));
      opt.step();
    };
    {
      auto m = make_mlp<Dev>(8, 32, 4, 1);
      DistributedDataParallel ddp(m, comm);
      optim::basic_adamw<float, Dev> opt(ddp.parameters(), {.lr = 1e-2});
      for (int s = 0; s < 6; ++s) {
        step(ddp, opt, s);
        if (s == 2) save_checkpoint(file, comm, ddp.module(), opt, TrainPosition{.step = 3});
      }
      straight[r] = weights(ddp.parameters());
    }
    auto m = make_mlp<Dev>(8, 32, 4, 7);  // other initial weights: the checkpoint replaces them
    DistributedDataParallel ddp(m, comm);
    optim::basic_adamw<float, Dev> opt(ddp.parameters(), {.lr = 1e-2});
    TrainPosition const pos = load_checkpoint(file, comm, ddp.module(), opt);
    for (int s = static_cast<int>(pos.step); s < 6; ++s) step(ddp, opt, s);
    resumed[r] = weights(ddp.parameters());
  });
  CHECK(straight[0] == resumed[0]);
  CHECK(straight[1] == resumed[1]);
}

TEST_CASE("device tensors: GradScaler's run is bitwise the unscaled one, and an overflow skips the step alike") {
  std::int64_t const B = 16;
  int const steps = 5;
  auto data = test::make_data(B * steps, 8, 4, 71);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    spawn(n, [&](ThreadsBackend& comm) {
      std::int64_t const local = B / n;
      auto m1 = make_mlp<Dev>(8, 32, 4, 1), m2 = make_mlp<Dev>(8, 32, 4, 1);
      DistributedDataParallel<decltype(m1), ThreadsBackend> plain(m1, comm), scaled(m2, comm);
      optim::basic_adamw<float, Dev> o1(plain.parameters(), {.lr = 1e-2}), o2(scaled.parameters(), {.lr = 1e-2});
      optim::basic_grad_scaler<float, Dev> scaler(scaled.parameters(), {.init_scale = 4096});
      for (int s = 0; s < steps; ++s) {
        std::int64_t const base = s * B + comm.rank() * local;
        auto hx = test::rows(data.x, base, local);
        auto const y = to_space<Dev>(test::rows(data.y, base, local));
        o1.zero_grad();
        backward(mse_loss(plain(Variable<float, Dev>(to_space<Dev>(hx))), y));
        o1.step();
        if (s == 3 && comm.rank() == n - 1) hx[0] = std::numeric_limits<float>::max();  // overflows the loss
        o2.zero_grad();
        backward(scaler.scale(mse_loss(scaled(Variable<float, Dev>(to_space<Dev>(hx))), y)));
        bool const stepped = scaler.step(o2);
        CHECK(stepped == (s != 3));
        if (s < 3) CHECK(weights(scaled.parameters()) == weights(plain.parameters()));
      }
      CHECK(scaler.get_scale() == 2048);
      CHECK(scaler.skipped_steps() == 1);
    });
  }
}

TEST_CASE("device tensors: static_graph gives the same bits as the host-read bookkeeping, at 1, 2 and 4 ranks") {
  std::int64_t const B = 16;
  int const steps = 6;
  auto data = test::make_data(B * steps, 8, 4, 17);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<float>> plain(n), frozen(n);
    BucketConfig const small{.cap_bytes = 256, .first_cap_bytes = 64};  // several buckets
    spawn(n, [&](ThreadsBackend& comm) {
      plain[comm.rank()] = device_ddp(comm, data, B, steps, small);
      frozen[comm.rank()] = device_ddp(comm, data, B, steps, small, {.static_graph = true});
    });
    for (int r = 0; r < n; ++r) CHECK(frozen[r] == plain[r]);
  }
}

TEST_CASE(
    "device tensors: under static_graph, a rank whose gradients change is named on every rank at the next "
    "host read") {
  using Branchy = test::BasicBranchy<Dev>;  // rank 1 drops `extra` at step 2
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::string> errors(n);
    spawn(n, [&](ThreadsBackend& comm) {
      Generator g(5);
      Branchy model(g);
      Variable<float, Dev> x(to_space<Dev>(full<float>({2, 4}, 1.0f)));
      DistributedDataParallel ddp(model, comm, {.find_unused_parameters = true, .static_graph = true});
      CHECK(ddp.describe().find(" ranks, static graph: 4 parameters") != std::string::npos);
      optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.1});
      for (int s = 0; s < 3; ++s) {
        model.use_extra = !(s == 2 && comm.rank() == 1);  // rank 1 drops `extra` at step 2
        opt.zero_grad();
        backward(sum(ddp(x)));
        opt.step();
      }
      try {
        (void)weights(ddp.parameters());  // the next host read
      } catch (DdpError const& e) {
        errors[comm.rank()] = e.what();
      }
      CHECK_NOTHROW((void)weights(ddp.parameters()));  // reported once; the device stays usable
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(errors[r].find("bucket 0 was reduced together with another collective: rank 1 sent no bucket id") !=
            std::string::npos);
      CHECK(errors[r].find("static_graph") != std::string::npos);
    }
  }
}

TEST_CASE(
    "device tensors: under static_graph, a desync is reported within static_graph_check_every steps though nothing "
    "reads the device") {
  using Branchy = test::BasicBranchy<Dev>;
  for (std::int64_t every : {1, 4}) {
    CAPTURE(every);
    std::vector<int> reported_at(2, -1);
    spawn(2, [&](ThreadsBackend& comm) {
      Generator g(5);
      Branchy model(g);
      Variable<float, Dev> x(to_space<Dev>(full<float>({2, 4}, 1.0f)));
      DistributedDataParallel ddp(
          model, comm, {.find_unused_parameters = true, .static_graph = true, .static_graph_check_every = every});
      optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.1});
      for (int s = 0; s < 12; ++s) {
        model.use_extra = !(s >= 2 && comm.rank() == 1);  // rank 1 drops `extra` from step 2 on
        try {
          opt.zero_grad();
          backward(sum(ddp(x)));  // no loss read, no evaluation: only the periodic check reads the device
          opt.step();
        } catch (DdpError const& e) {
          CHECK(std::string(e.what()).find("static_graph") != std::string::npos);
          reported_at[static_cast<std::size_t>(comm.rank())] = s;
          break;
        }
      }
    });
    // Rounds 1 .. stay on the device (round 0 freezes the words); the check after every `every` of them.
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(reported_at[static_cast<std::size_t>(r)] >= 2);
      CHECK(reported_at[static_cast<std::size_t>(r)] <= 2 + every - 1);
    }
  }
  spawn(1, [&](ThreadsBackend& comm) {
    Generator g(5);
    test::BasicBranchy<Dev> model(g);
    CHECK_THROWS_WITH_AS(DistributedDataParallel(model, comm, {.static_graph = true, .static_graph_check_every = 0}),
                         doctest::Contains("static_graph_check_every must be at least 1"), ArgumentError);
  });
}

// 7 steps of `Opt` (LocalSgd or DiLoCo over SGD) on an MLP over tensors of space S, each rank its own rows: the
// weights after them, on the host.
template <MemorySpace S, class Opt>
std::vector<float> local_rounds_run(ThreadsBackend& comm, test::Data const& data, typename Opt::options_type const& o) {
  int const n = comm.world_size(), r = comm.rank();
  auto model = make_mlp<S>(8, 16, 4, 3);
  DistributedDataParallel ddp(model, comm, {}, {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 64}}});
  Opt opt(ddp, o);
  for (int s = 0; s < 7; ++s) {
    opt.zero_grad();
    auto const x = to_space<S>(test::rows(data.x, (s * n + r) * 4, 4));
    backward(mse_loss(ddp(Variable<float, S>(x)), to_space<S>(test::rows(data.y, (s * n + r) * 4, 4))));
    opt.step();
  }
  return weights(ddp.parameters());
}

TEST_CASE("device tensors: LocalSgd (its warm-up, averages and averaged momentum) and DiLoCo train as on the host") {
  spawn(2, [](ThreadsBackend& comm) {
    auto const data = test::make_data(7 * 2 * 4, 8, 4, 41);
    using DevSgd = optim::basic_sgd<float, Dev>;
    using HostSgd = optim::basic_sgd<float, HostSpace>;
    optim::SgdOptions const sgd{.lr = 0.05, .momentum = 0.9};
    LocalSgdOptions const local{.period = 3, .warmup_steps = 2, .average_optimizer_state = true};
    CHECK(rel_diff(
              local_rounds_run<Dev, LocalSgd<DevSgd, ThreadsBackend>>(comm, data, {.optimizer = sgd, .local = local}),
              local_rounds_run<HostSpace, LocalSgd<HostSgd, ThreadsBackend>>(
                  comm, data, {.optimizer = sgd, .local = local})) < 1e-6);
    DiLoCoOptions const outer{.period = 3};
    CHECK(
        rel_diff(local_rounds_run<Dev, DiLoCo<DevSgd, ThreadsBackend>>(comm, data, {.optimizer = sgd, .outer = outer}),
                 local_rounds_run<HostSpace, DiLoCo<HostSgd, ThreadsBackend>>(
                     comm, data, {.optimizer = sgd, .outer = outer})) < 1e-6);
  });
}

TEST_CASE("device tensors: under static_graph, ranks with uneven batches train inside ddp::join as without it") {
  // Rank r has 2 + r steps: the ranks that run out shadow the others' rounds (status words through the host), while
  // the active ones keep theirs on the device.
  std::int64_t const local = 4;
  auto data = test::make_data(local * 4 * 6, 8, 4, 23);
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<float>> plain(n), frozen(n);
    spawn(n, [&](ThreadsBackend& comm) {
      int const r = comm.rank();
      auto run = [&](DdpOptions opts) {
        auto model = make_mlp<Dev>(8, 16, 4, 1);
        DistributedDataParallel ddp(model, comm, opts,
                                    {.bucketer = SizeCapped{{.cap_bytes = 256, .first_cap_bytes = 64}}});
        optim::basic_sgd<float, Dev> opt(ddp.parameters(), {.lr = 0.05, .momentum = 0.9});
        JoinResult const res = join(ddp, opt, [&] {
          for (int s = 0; s < 2 + r; ++s) {
            std::int64_t const base = (static_cast<std::int64_t>(s) * n + r) * local;
            opt.zero_grad();
            backward(mse_loss(ddp(Variable<float, Dev>(to_space<Dev>(test::rows(data.x, base, local)))),
                              to_space<Dev>(test::rows(data.y, base, local))));
            opt.step();
          }
        });
        CHECK(res.rounds == 2 + n - 1);
        return weights(ddp.parameters());
      };
      plain[r] = run({});
      frozen[r] = run({.static_graph = true});
    });
    for (int r = 0; r < n; ++r) {
      CHECK(frozen[r] == plain[r]);
      CHECK(frozen[r] == frozen[0]);
    }
  }
}

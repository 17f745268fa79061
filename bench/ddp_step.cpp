// bench/ddp_step: one DDP training step for the toy, MLP, wide and CNN models, split into forward, backward
// (including DDP's wait for its buckets), optimizer, and exposed communication = DDP step − plain step.
// Medians over many steps after warm-up; rank 0 reports.
//   bazel run //bench:ddp_step -- --world-size 2            (threads)
//   mpirun -n 2 bazel-bin/bench/ddp_step --backend mpi
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "ddp/parallel/deterministic.hpp"
#include "examples/common/flags.hpp"
#include "examples/common/launch.hpp"

using namespace ddp;
using Clock = std::chrono::steady_clock;

namespace {

struct Phases {
  double fwd = 0, bwd = 0, opt = 0, step = 0;  // seconds (medians)
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

template <class Fwd, class Opt, class Loss>
Phases time_steps(Fwd&& fwd, Opt& opt, Tensor<float> const& x, Loss&& loss, int warmup, int iters) {
  std::vector<double> f, b, o, s;
  for (int i = 0; i < warmup + iters; ++i) {
    auto const t0 = Clock::now();
    opt.zero_grad();
    Var l = loss(fwd(Var(x)));
    auto const t1 = Clock::now();
    backward(l);
    auto const t2 = Clock::now();
    opt.step();
    auto const t3 = Clock::now();
    if (i < warmup) continue;
    f.push_back(std::chrono::duration<double>(t1 - t0).count());
    b.push_back(std::chrono::duration<double>(t2 - t1).count());
    o.push_back(std::chrono::duration<double>(t3 - t2).count());
    s.push_back(std::chrono::duration<double>(t3 - t0).count());
  }
  return {median(f), median(b), median(o), median(s)};
}

Tensor<float> rnd(Shape s, Generator& g) {
  Tensor<float> t(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = g.uniform(-1.0f, 1.0f);
  return t;
}

template <class Comm, class MakeModel, class MakeOpt, class Loss>
void bench(Comm& comm, char const* name, MakeModel&& make_model, MakeOpt&& make_opt, Tensor<float> const& x,
           Loss&& loss, int warmup, int iters, double target, char const* unit, std::size_t cap) {
  double const k = std::string(unit) == "us" ? 1e6 : 1e3;
  // Plain (no DDP) on every rank at once, so the machine is as loaded as in the DDP run.
  auto pm = make_model();
  nn::ParameterArena<float> pa(pm);
  auto popt = make_opt(pa);
  comm.barrier();
  Phases plain = time_steps([&](Var const& v) { return pm(v); }, popt, x, loss, warmup, iters);
  auto dm = make_model();
  DistributedDataParallel ddp(
      dm, comm, {},
      {.bucketer = SizeCapped{{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)}}});
  auto dopt = make_opt(ddp.parameters());
  comm.barrier();
  Phases d = time_steps([&](Var const& v) { return ddp(v); }, dopt, x, loss, warmup, iters);
  // Plain again, after: the comparison uses the faster of the two plain runs (both ran under the same
  // conditions as the DDP run; the order of runs alone moves a 2 µs step by a few percent).
  comm.barrier();
  Phases plain2 = time_steps([&](Var const& v) { return pm(v); }, popt, x, loss, warmup, iters);
  if (plain2.step < plain.step) plain = plain2;
  if (comm.rank() == 0) {
    std::printf("[plain fwd %.3f bwd %.3f opt %.3f] ", plain.fwd * k, plain.bwd * k, plain.opt * k);
    std::printf(
        "%-5s ws=%d  plain %8.3f %s | ddp %8.3f %s (fwd %.3f, bwd+wait %.3f, opt %.3f) | exposed comm %8.3f %s | "
        "ddp/plain %.3f | %zu buckets | target <= %g %s %s\n",
        name, comm.world_size(), plain.step * k, unit, d.step * k, unit, d.fwd * k, d.bwd * k, d.opt * k,
        (d.step - plain.step) * k, unit, d.step / plain.step, ddp.plan().buckets.size(), target, unit,
        comm.world_size() == 1 ? (d.step <= 1.03 * plain.step ? "(ws1: within 3%: OK)" : "(ws1: within 3%: MISS)")
                               : (d.step * k <= target ? "OK" : "MISS"));
    std::fflush(stdout);
  }
}

// Deterministic mode next to the default DDP, A/B interleaved step by step on two copies of the model (the
// same machine conditions for both): DDP's overlapped float all-reduce vs deterministic mode (ExactSum) with V
// micro-batches (exact integer sums). Rank 0 reports medians.
template <class Comm, class MakeModel, class MakeOpt, class Loss>
void bench_det(Comm& comm, char const* name, MakeModel&& make_model, MakeOpt&& make_opt, Tensor<float> const& x,
               Tensor<std::int32_t> const& y, Loss&& loss, std::int64_t v, int warmup, int iters) {
  auto dm = make_model();
  DistributedDataParallel ddp(dm, comm);
  auto dopt = make_opt(ddp.parameters());
  auto zm = make_model();
  DeterministicDataParallel<decltype(zm), Comm> det(zm, comm, {}, {.batching = {.count = v}});
  auto zopt = make_opt(det.parameters());
  std::vector<double> a, b;
  comm.barrier();
  for (int i = 0; i < warmup + iters; ++i) {
    auto const t0 = Clock::now();
    dopt.zero_grad();
    backward(loss(ddp(Var(x))));
    dopt.step();
    auto const t1 = Clock::now();
    zopt.zero_grad();
    for (auto const& mb : det.micro_batches(x, y, {.step = static_cast<std::uint64_t>(i)}))
      backward(cross_entropy(det(mb), mb.y));
    zopt.step();
    auto const t2 = Clock::now();
    if (i < warmup) continue;
    a.push_back(std::chrono::duration<double>(t1 - t0).count());
    b.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  if (comm.rank() == 0) {
    double const da = median(a) * 1e3, db = median(b) * 1e3;
    std::printf("%-5s ws=%d  ddp %8.3f ms | deterministic V=%lld %8.3f ms | det/ddp %.3f | target <= 1.25 %s\n", name,
                comm.world_size(), da, static_cast<long long>(v), db, db / da,
                v == comm.world_size() ? (db <= 1.25 * da ? "OK" : "MISS") : "(more micro-batches than ranks)");
    std::fflush(stdout);
  }
}

// The update overlapped with communication (OverlappedOptimizer), A/B/C(/D) interleaved step by step on copies of
// the model: plain training, DDP stepping after backward, DDP with each bucket updated as it lands, and (ranks
// sharing an address space) OwnerReduce with ZeRO-1 reducing its own slices into its update. Rank 0 reports
// medians and the ratios to plain.
template <class O, class Comm, class MakeModel, class Loss>
void bench_overlap(Comm& comm, char const* name, MakeModel&& make_model, typename O::options_type const& opt,
                   Tensor<float> const& x, Loss&& loss, int warmup, int iters, std::size_t cap) {
  SizeCapped const bucketer{{.cap_bytes = cap, .first_cap_bytes = std::min(cap, kDefaultFirstBucketBytes)}};
  auto pm = make_model();
  O popt(nn::ParameterArena<float>(pm), opt);
  auto dm = make_model();
  DistributedDataParallel ddp(dm, comm, {}, DdpPolicies{.bucketer = bucketer});
  O dopt(ddp.parameters(), opt);
  auto om = make_model();
  DistributedDataParallel oddp(om, comm, {}, DdpPolicies{.bucketer = bucketer});
  OverlappedOptimizer<O> oopt(oddp, {.optimizer = opt});
  // Ranks that share an address space also time OwnerReduce: ZeRO-1 reducing its own slices into its update.
  constexpr bool kOwner = SharedAddressSpace<Comm>;
  using Model = decltype(make_model());
  using OwnerDdp = DistributedDataParallel<Model, Comm, SizeCapped, OwnerReduce>;
  auto wm = make_model();
  std::optional<OwnerDdp> wddp;
  std::optional<ZeroRedundancyOptimizer<O, Comm>> wopt;
  if constexpr (kOwner) {
    wddp.emplace(wm, comm, DdpOptions{}, DdpPolicies<SizeCapped, OwnerReduce>{.bucketer = bucketer});
    wopt.emplace(*wddp, typename ZeroRedundancyOptimizer<O, Comm>::options_type{.optimizer = opt});
  }
  std::vector<double> p, d, o, w;
  auto timed = [&](auto& model, auto& optimizer, std::vector<double>& into, bool keep) {
    auto const t0 = Clock::now();
    optimizer.zero_grad();
    backward(loss(model(Var(x))));
    optimizer.step();
    if (keep) into.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  };
  comm.barrier();
  for (int i = 0; i < warmup + iters; ++i) {
    bool const keep = i >= warmup;
    timed(pm, popt, p, keep);
    comm.barrier();
    timed(ddp, dopt, d, keep);
    timed(oddp, oopt, o, keep);
    if constexpr (kOwner) timed(*wddp, *wopt, w, keep);
  }
  if (comm.rank() == 0) {
    double const mp = median(p) * 1e3, md = median(d) * 1e3, mo = median(o) * 1e3;
    std::printf(
        "%-5s ws=%d  plain %8.3f ms | ddp %8.3f ms | ddp overlapped update %8.3f ms | ddp/plain %.3f | "
        "overlapped/plain %.3f | overlapped/ddp %.3f | %zu buckets | target overlapped/plain <= 1.05 %s\n",
        name, comm.world_size(), mp, md, mo, md / mp, mo / mp, mo / md, ddp.plan().buckets.size(),
        mo <= 1.05 * mp ? "OK" : "MISS");
    if constexpr (kOwner) {
      double const mw = median(w) * 1e3;
      std::printf(
          "%-5s ws=%d  plain %8.3f ms | ddp OwnerReduce + ZeRO-1 %8.3f ms | owner/plain %.3f | owner/ddp %.3f | "
          "target owner/plain <= 1.05 %s\n",
          name, comm.world_size(), mp, mw, mw / mp, mw / md, mw <= 1.05 * mp ? "OK" : "MISS");
    }
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  examples::Flags flags("ddp_step", "DDP step time split into phases, vs plain training.");
  examples::add_launch_flags(flags)
      .add("models", "toy,mlp,wide", "comma-separated subset of toy,mlp,wide,cnn")
      .add("deterministic", "", "only compare deterministic mode with DDP, for a subset of mlp,cnn (e.g. mlp,cnn)")
      .add("overlap-update", "",
           "only compare DDP with and without the update overlapped with communication, for a subset of "
           "mlp,wide,cnn (e.g. wide)");
  try {
    if (!flags.parse(argc, argv)) return 0;
    auto const launch = examples::launch_choice(flags);
    std::string const models = "," + flags.str("models") + ",";
    std::string const det = "," + flags.str("deterministic") + ",";
    std::string const ovl = "," + flags.str("overlap-update") + ",";
    for (std::string const list : {flags.str("models"), flags.str("deterministic"), flags.str("overlap-update")})
      for (std::size_t at = 0; at <= list.size() && !list.empty();) {
        std::size_t const end = std::min(list.find(',', at), list.size());
        std::string const m = list.substr(at, end - at);
        if (m != "toy" && m != "mlp" && m != "wide" && m != "cnn")
          throw ArgumentError("ddp_step: unknown model '" + m + "' (choose from toy, mlp, wide, cnn)");
        at = end + 1;
      }
    return examples::launch(launch, argc, argv, [&](auto& comm) {
      Generator g(1 + static_cast<std::uint64_t>(comm.rank()));
      if (comm.rank() == 0)
        std::printf("ddp_step: backend %s, world size %d\n", flags.str("backend").c_str(), comm.world_size());
      if (ovl != ",,") {
        if (ovl.find(",mlp,") != std::string::npos) {
          auto x = rnd({32, 1, 28, 28}, g);
          Tensor<std::int32_t> y(Shape{32});
          for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
          bench_overlap<optim::SGD>(
              comm, "mlp",
              [] {
                Generator i(0);
                return nn::Sequential(nn::Flatten(), nn::Linear(784, 256, i), nn::ReLU(), nn::Linear(256, 128, i),
                                      nn::ReLU(), nn::Linear(128, 10, i));
              },
              {.lr = 0.01, .momentum = 0.9}, x, [&](Var const& o) { return cross_entropy(o, y); }, 50, 500,
              kDefaultBucketCapBytes);
        }
        if (ovl.find(",cnn,") != std::string::npos) {
          auto x = rnd({32, 1, 28, 28}, g);
          Tensor<std::int32_t> y(Shape{32});
          for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
          bench_overlap<optim::AdamW>(
              comm, "cnn",
              [] {
                Generator i(0);
                return nn::Sequential(nn::Conv2d(1, 32, 3, i), nn::ReLU(), nn::Conv2d(32, 64, 3, i), nn::ReLU(),
                                      nn::MaxPool2d(2), nn::Flatten(), nn::Linear(9216, 128, i), nn::ReLU(),
                                      nn::Linear(128, 10, i));
              },
              {.lr = 1e-3}, x, [&](Var const& o) { return cross_entropy(o, y); }, 5, 60, kDefaultBucketCapBytes);
        }
        if (ovl.find(",wide,") != std::string::npos) {
          auto x = rnd({2, 10}, g), y = rnd({2, 5}, g);
          bench_overlap<optim::SGD>(
              comm, "wide",
              [] {
                Generator i(0);
                return nn::Sequential(nn::Linear(10, 10000, i), nn::ReLU(), nn::Linear(10000, 10000, i), nn::ReLU(),
                                      nn::Linear(10000, 5, i));
              },
              {.lr = 0.001}, x, [&](Var const& o) { return mse_loss(o, y); }, 2, 15, std::size_t{1} << 20);
        }
        return;
      }
      if (det != ",,") {
        auto x = rnd({32, 1, 28, 28}, g);
        Tensor<std::int32_t> y(Shape{32});
        for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
        auto ce = [&](Var const& o) { return cross_entropy(o, y); };
        auto const ws = static_cast<std::int64_t>(comm.world_size());
        for (std::int64_t v : {ws, 4 * ws}) {
          if (det.find(",mlp,") != std::string::npos)
            bench_det(
                comm, "mlp",
                [] {
                  Generator i(0);
                  return nn::Sequential(nn::Flatten(), nn::Linear(784, 256, i), nn::ReLU(), nn::Linear(256, 128, i),
                                        nn::ReLU(), nn::Linear(128, 10, i));
                },
                [](auto& p) { return optim::SGD(p, {.lr = 0.01, .momentum = 0.9}); }, x, y, ce, v, 30, 300);
          if (det.find(",cnn,") != std::string::npos)
            bench_det(
                comm, "cnn",
                [] {
                  Generator i(0);
                  return nn::Sequential(nn::Conv2d(1, 32, 3, i), nn::ReLU(), nn::Conv2d(32, 64, 3, i), nn::ReLU(),
                                        nn::MaxPool2d(2), nn::Dropout(0.25, 7), nn::Flatten(), nn::Linear(9216, 128, i),
                                        nn::ReLU(), nn::Dropout(0.5, 8), nn::Linear(128, 10, i));
                },
                [](auto& p) { return optim::AdamW(p, {.lr = 1e-3}); }, x, y, ce, v, 5, 40);
        }
        return;
      }
      if (models.find(",toy,") != std::string::npos) {
        auto x = rnd({5, 10}, g), y = rnd({5, 5}, g);
        bench(
            comm, "toy",
            [] {
              Generator i(0);
              return nn::Sequential(nn::Linear(10, 10, i), nn::ReLU(), nn::Linear(10, 5, i));
            },
            [](auto& p) { return optim::SGD(p, {.lr = 0.001}); }, x, [&](Var const& o) { return mse_loss(o, y); }, 2000,
            20000, 20, "us", kDefaultBucketCapBytes);
      }
      if (models.find(",mlp,") != std::string::npos) {
        auto x = rnd({32, 1, 28, 28}, g);
        Tensor<std::int32_t> y(Shape{32});
        for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
        bench(
            comm, "mlp",
            [] {
              Generator i(0);
              return nn::Sequential(nn::Flatten(), nn::Linear(784, 256, i), nn::ReLU(), nn::Linear(256, 128, i),
                                    nn::ReLU(), nn::Linear(128, 10, i));
            },
            [](auto& p) { return optim::SGD(p, {.lr = 0.01, .momentum = 0.9}); }, x,
            [&](Var const& o) { return cross_entropy(o, y); }, 50, 500, 0.6, "ms", kDefaultBucketCapBytes);
      }
      if (models.find(",cnn,") != std::string::npos) {  // BasicNet, 32 samples per rank (64 global at ws 2)
        auto x = rnd({32, 1, 28, 28}, g);
        Tensor<std::int32_t> y(Shape{32});
        for (int i = 0; i < 32; ++i) y[i] = static_cast<std::int32_t>(g.below(10));
        auto const seed = 7 + static_cast<std::uint64_t>(comm.rank());
        bench(
            comm, "cnn",
            [seed] {
              Generator i(0);
              return nn::Sequential(nn::Conv2d(1, 32, 3, i), nn::ReLU(), nn::Conv2d(32, 64, 3, i), nn::ReLU(),
                                    nn::MaxPool2d(2), nn::Dropout(0.25, seed), nn::Flatten(), nn::Linear(9216, 128, i),
                                    nn::ReLU(), nn::Dropout(0.5, seed + 100), nn::Linear(128, 10, i));
            },
            [](auto& p) { return optim::AdamW(p, {.lr = 1e-3}); }, x, [&](Var const& o) { return cross_entropy(o, y); },
            10, 100, 22, "ms", kDefaultBucketCapBytes);
      }
      if (models.find(",wide,") != std::string::npos) {
        auto x = rnd({2, 10}, g), y = rnd({2, 5}, g);
        bench(
            comm, "wide",
            [] {
              Generator i(0);
              return nn::Sequential(nn::Linear(10, 10000, i), nn::ReLU(), nn::Linear(10000, 10000, i), nn::ReLU(),
                                    nn::Linear(10000, 5, i));
            },
            [](auto& p) { return optim::SGD(p, {.lr = 0.001}); }, x, [&](Var const& o) { return mse_loss(o, y); }, 2, 9,
            300, "ms", std::size_t{1} << 20);
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

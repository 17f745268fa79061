// allreduce: bus bandwidth (nccl-tests convention) of ThreadsBackend and MpiBackend, side by side with the
// simplest in-process loop, raw MPI_Allreduce on the same buffers and, on one node, the simplest in-place loop
// in a shared window (the memory limit), 4 KiB-400 MB, plus small-message latency.
// Run: mpirun -n P bazel-bin/bench/comm/allreduce  (P ranks for MPI, P threads for the threads part);
// threads only: bazel-bin/bench/comm/allreduce --no-mpi --threads-world=P. Options: see kUsage.
#include <mpi.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/mpi.hpp"
#include "ddp/comm/threads.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::size_t min_bytes = 4096;
  std::size_t max_bytes = 400'000'000;
  double budget_s = 0.15;  // per size and variant
  int max_iters = 200;
  bool mpi = true;
  bool threads = true;
  int threads_world = 0;       // 0: the MPI world size
  bool rewrite = false;        // each rank rewrites its whole buffer before every timed MPI all-reduce
  bool mean = false;           // the MPI columns: mean time per call instead of the median
  ddp::MpiNodeOptions node{};  // MpiBackend's all-reduce layout (--chunk-bytes=, --ranks-per-node=)
};

constexpr char const* kUsage =
    "usage: [mpirun -n P] allreduce [--min-bytes=N] [--max-bytes=N] [--budget-ms=MS] [--max-iters=N]\n"
    "         [--no-mpi] [--no-threads] [--threads-world=P] [--rewrite] [--chunk-bytes=N]\n"
    "         [--streaming-bytes=N] [--ranks-per-node=K] [--window-stores=adaptive|streaming|plain]\n"
    "         (MpiNodeOptions of the MpiBackend columns; the plain-stores columns always store plainly)\n"
    "         [--mean]\n"
    "  --mean: the MPI columns give the mean time per call (else the median), which counts the calls that\n"
    "  WindowStores::kAdaptive spends trying the slower stores\n"
    "  --rewrite: before every timed MPI all-reduce each rank writes its whole buffer, as a backward pass leaves\n"
    "  DDP's gradients (else a buffer holds the previous all-reduce's result: with gradients in place each\n"
    "  rank's stripe is then already in its own cache, which training never sees)\n";

// Exits with the usage on --help (0) or on a flag it does not know or a bad number (2).
Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string const s = argv[i];
    auto value = [&](char const* key) -> char const* {
      return s.rfind(key, 0) == 0 ? s.c_str() + std::strlen(key) : nullptr;
    };
    try {
      if (auto v = value("--max-bytes=")) {
        a.max_bytes = std::stoull(v);
      } else if (auto v = value("--min-bytes=")) {
        a.min_bytes = std::stoull(v);
      } else if (auto v = value("--budget-ms=")) {
        a.budget_s = std::stod(v) / 1000.0;
      } else if (auto v = value("--max-iters=")) {
        a.max_iters = std::stoi(v);
      } else if (auto v = value("--threads-world=")) {
        a.threads_world = std::stoi(v);
      } else if (auto v = value("--chunk-bytes=")) {
        a.node.chunk_bytes = std::stoull(v);
      } else if (auto v = value("--streaming-bytes=")) {
        a.node.streaming_bytes = std::stoull(v);
      } else if (auto v = value("--ranks-per-node=")) {
        a.node.ranks_per_node = std::stoi(v);
      } else if (s == "--no-mpi") {
        a.mpi = false;
      } else if (s == "--no-threads") {
        a.threads = false;
      } else if (auto v = value("--window-stores=")) {
        std::string const w = v;
        if (w != "adaptive" && w != "streaming" && w != "plain") throw std::invalid_argument(w);
        a.node.window_stores = w == "adaptive"    ? ddp::WindowStores::kAdaptive
                               : w == "streaming" ? ddp::WindowStores::kStreaming
                                                  : ddp::WindowStores::kPlain;
      } else if (s == "--mean") {
        a.mean = true;
      } else if (s == "--rewrite") {
        a.rewrite = true;
      } else if (s == "--help" || s == "-h") {
        std::fputs(kUsage, stdout);
        std::exit(0);
      } else {
        std::fprintf(stderr, "allreduce: unknown flag '%s'\n%s", s.c_str(), kUsage);
        std::exit(2);
      }
    } catch (std::exception const&) {
      std::fprintf(stderr, "allreduce: bad value in '%s'\n%s", s.c_str(), kUsage);
      std::exit(2);
    }
  }
  if (a.min_bytes == 0 || a.min_bytes > a.max_bytes) {
    std::fprintf(stderr, "allreduce: need 0 < --min-bytes (%zu) <= --max-bytes (%zu)\n", a.min_bytes, a.max_bytes);
    std::exit(2);
  }
  return a;
}

std::vector<std::size_t> sizes(Args const& a) {
  std::vector<std::size_t> out;
  for (std::size_t b = a.min_bytes; b < a.max_bytes; b *= 4) out.push_back(b);
  out.push_back(a.max_bytes);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// nccl-tests: algbw = bytes / time, busbw = algbw * 2 (p - 1) / p.
double busbw_gbs(std::size_t bytes, double seconds, int p) {
  return seconds <= 0 ? 0.0 : static_cast<double>(bytes) / seconds * 2.0 * (p - 1) / p / 1e9;
}

int iterations_for(double first_s, Args const& a) {
  return std::clamp(static_cast<int>(a.budget_s / std::max(first_s, 1e-9)), 3, a.max_iters);
}

struct Row {
  std::size_t bytes = 0;
  double threads = 0, threads_async = 0, loop = 0;  // seconds (median)
  double mpi = 0, mpi_async = 0, mpi_flat = 0, mpi_cached = 0, mpi_in_place = 0, mpi_in_place_plain = 0, raw = 0;
  double window_loop = 0;  // 0: not run (ranks on more than one node)
};

// The limit the in-place path works against, measured in the same run: every rank's buffer in one MPI-3
// shared window (MpiBackend's in-place layout), each rank sums its slice of all buffers and stores the sum into
// every one of them, then one barrier. No chunks, no store choice, no progress thread, no error checks: the
// least memory traffic and synchronisation an in-place all-reduce can have (each element of a rank's slice read
// and written once in every buffer), so "in place / loop" says how much of the machine's limit the library
// gets, and "raw MPI / loop" how much MPICH does. Only where all ranks share one node.
class WindowLoop {
 public:
  explicit WindowLoop(std::size_t max_floats) {
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_);
    MPI_Comm_rank(node_, &rank_);
    MPI_Comm_size(node_, &size_);
    int const all_here = size_ == world ? 1 : 0;
    int usable = 0;
    MPI_Allreduce(&all_here, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!usable) return;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    float* base = nullptr;
    MPI_Win_allocate_shared(static_cast<MPI_Aint>(max_floats * sizeof(float) + 64), sizeof(float), info, node_, &base,
                            &win_);
    MPI_Info_free(&info);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win_);  // one passive-target epoch for the window's life (MPI_Win_sync)
    std::fill(base, base + max_floats, 0.0f);  // first touch by the owner, as gradient_storage does
    for (int k = 0; k < size_; ++k) {
      MPI_Aint bytes = 0;
      int unit = 0;
      float* b = nullptr;
      MPI_Win_shared_query(win_, k, &bytes, &unit, &b);
      bufs_.push_back(b);
    }
    MPI_Barrier(node_);
  }
  ~WindowLoop() {
    if (win_ != MPI_WIN_NULL) {
      MPI_Win_unlock_all(win_);
      MPI_Win_free(&win_);
    }
    MPI_Comm_free(&node_);
  }
  WindowLoop(WindowLoop const&) = delete;
  WindowLoop& operator=(WindowLoop const&) = delete;

  bool usable() const { return win_ != MPI_WIN_NULL; }
  float* own() const { return bufs_[static_cast<std::size_t>(rank_)]; }

  // The all-reduce of the first n floats of every rank's buffer: callers have passed a barrier since the last
  // write into their buffer (the benchmark's MPI_Barrier before its clock starts).
  void all_reduce(std::size_t n) {
    MPI_Win_sync(win_);  // the peers' writes before that barrier, in the MPI-3 shared-memory model
    std::size_t const per = (n + static_cast<std::size_t>(size_) - 1) / static_cast<std::size_t>(size_);
    std::size_t const lo = std::min(n, per * static_cast<std::size_t>(rank_)), hi = std::min(n, lo + per);
    if (size_ == 2) {
      float* __restrict const x = bufs_[0];
      float* __restrict const y = bufs_[1];
      for (std::size_t i = lo; i < hi; ++i) {
        float const s = x[i] + y[i];
        x[i] = s;
        y[i] = s;
      }
    } else {
      constexpr std::size_t kBlock = 512;  // a sum through L1, then stored into every buffer
      alignas(64) float sum[kBlock];
      for (std::size_t b = lo; b < hi; b += kBlock) {
        std::size_t const m = std::min(kBlock, hi - b);
        float const* __restrict const first = bufs_[0] + b;
        for (std::size_t j = 0; j < m; ++j) sum[j] = first[j];
        for (int k = 1; k < size_; ++k) {
          float const* __restrict const src = bufs_[static_cast<std::size_t>(k)] + b;
          for (std::size_t j = 0; j < m; ++j) sum[j] += src[j];
        }
        for (int k = 0; k < size_; ++k) {
          float* __restrict const dst = bufs_[static_cast<std::size_t>(k)] + b;
          for (std::size_t j = 0; j < m; ++j) dst[j] = sum[j];
        }
      }
    }
    MPI_Win_sync(win_);
    MPI_Barrier(node_);  // every slice stored in every buffer
  }

 private:
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<float*> bufs_;
};

// ---- MPI: raw MPI_Allreduce, MpiBackend (default layout: shared memory on a node; sync and async) and
// MpiBackend with NodeAllReduce::kMpi (its MPI_Iallreduce path) and with plain stores into the window at every
// size (WindowStores::kPlain), and MpiBackend on a buffer in its gradient_storage (on one node: reduced in place
// in a shared window, as DDP's gradients are), and the window loop (WindowLoop), interleaved per iteration ----
void bench_mpi(ddp::MpiBackend& comm, ddp::MpiBackend& flat, ddp::MpiBackend& cached, Args const& a,
               std::vector<Row>& rows) {
  std::vector<float> buf(a.max_bytes / sizeof(float), 0.0f);
  auto storage = comm.gradient_storage<float>(static_cast<std::int64_t>(buf.size()));
  auto plain_storage = cached.gradient_storage<float>(static_cast<std::int64_t>(buf.size()));
  std::fill(storage.data(), storage.data() + storage.numel(), 0.0f);
  std::fill(plain_storage.data(), plain_storage.data() + plain_storage.numel(), 0.0f);
  MPI_Comm raw_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm);
  WindowLoop loop(buf.size());
  int const variants = loop.usable() ? 8 : 7;
  for (Row& row : rows) {
    std::size_t const n = row.bytes / sizeof(float);
    auto one = [&](int variant) {
      if (a.rewrite) {  // the whole buffer, from this rank, as a backward pass writes DDP's gradients
        float* const dst = variant == 5   ? storage.data()
                           : variant == 6 ? plain_storage.data()
                           : variant == 7 ? loop.own()
                                          : buf.data();
        std::fill(dst, dst + n, 0.5f);
      }
      MPI_Barrier(raw_comm);
      double const t0 = MPI_Wtime();
      if (variant == 0) {
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, raw_comm);
      } else if (variant == 1) {
        comm.all_reduce(std::span(buf).first(n), ddp::ReduceOp::kSum);
      } else if (variant == 2) {
        comm.all_reduce_async(std::span(buf).first(n), ddp::ReduceOp::kSum).wait();
      } else if (variant == 3) {
        flat.all_reduce(std::span(buf).first(n), ddp::ReduceOp::kSum);
      } else if (variant == 4) {
        cached.all_reduce(std::span(buf).first(n), ddp::ReduceOp::kSum);
      } else if (variant == 5) {
        comm.all_reduce(std::span(storage.data(), n), ddp::ReduceOp::kSum);
      } else if (variant == 6) {
        cached.all_reduce(std::span(plain_storage.data(), n), ddp::ReduceOp::kSum);
      } else {
        loop.all_reduce(n);
      }
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, raw_comm);  // the slowest rank's time
      return dt;
    };
    double first = 0;
    for (int v = 0; v < variants; ++v) first = std::max(first, one(v));
    int const iters = std::max(5, iterations_for(first, a) / 4 + 1);  // MPI oversubscribed is noisy: >= 5 rounds
    auto const stat = [&](std::vector<double> const& v) {
      return a.mean ? std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size()) : median(v);
    };
    std::vector<double> t[8];
    // A new order each round (the same on every rank: a fixed seed): a variant's speed depends on what ran
    // before it (whose lines the caches hold), and a fixed or rotated order makes each follow the same one.
    std::mt19937 shuffle_rng(static_cast<std::uint32_t>(row.bytes));
    std::vector<int> order(static_cast<std::size_t>(variants));
    std::iota(order.begin(), order.end(), 0);
    for (int i = 0; i < iters; ++i) {
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (int v : order) t[v].push_back(one(v));
    }
    row.raw = stat(t[0]);
    row.mpi = stat(t[1]);
    row.mpi_async = stat(t[2]);
    row.mpi_flat = stat(t[3]);
    row.mpi_cached = stat(t[4]);
    row.mpi_in_place = stat(t[5]);
    row.mpi_in_place_plain = stat(t[6]);
    if (loop.usable()) row.window_loop = stat(t[7]);
  }
  MPI_Comm_free(&raw_comm);
}

// ---- threads: ThreadsBackend (sync, async) and the plain loop, p threads ----------------------------
void bench_threads(int p, Args const& a, std::vector<Row>& rows, double& lat4, double& lat4k) {
  std::size_t const cap = a.max_bytes / sizeof(float);
  std::vector<float*> bufs(static_cast<std::size_t>(p));
  std::vector<std::vector<double>> times(static_cast<std::size_t>(p), std::vector<double>(a.max_iters + 1));
  std::barrier sync(p);
  ddp::spawn(p, [&](ddp::ThreadsBackend& comm) {
    int const r = comm.rank();
    std::vector<float> mine(cap, 0.0f);  // first touch on this rank's thread
    bufs[static_cast<std::size_t>(r)] = mine.data();
    comm.barrier();
    // The reference: each thread sums its slice of all buffers, a barrier, each copies the other slices.
    auto plain_loop = [&](std::size_t n) {
      std::size_t const per = (n + p - 1) / p;
      std::size_t const lo = std::min(n, per * r), hi = std::min(n, lo + per);
      float* own = mine.data();
      for (int k = 0; k < p; ++k) {
        if (k == r) continue;
        float const* other = bufs[static_cast<std::size_t>(k)];
        for (std::size_t i = lo; i < hi; ++i) own[i] += other[i];
      }
      sync.arrive_and_wait();
      for (int k = 0; k < p; ++k) {
        if (k == r) continue;
        std::size_t const klo = std::min(n, per * k), khi = std::min(n, klo + per);
        std::memcpy(own + klo, bufs[static_cast<std::size_t>(k)] + klo, (khi - klo) * sizeof(float));
      }
      sync.arrive_and_wait();
    };
    auto run = [&](int variant, std::size_t n, int iters) {
      for (int i = 0; i < iters; ++i) {
        comm.barrier();
        auto const t0 = Clock::now();
        if (variant == 0) {
          comm.all_reduce(std::span(mine).first(n), ddp::ReduceOp::kSum);
        } else if (variant == 1) {
          comm.all_reduce_async(std::span(mine).first(n), ddp::ReduceOp::kSum).wait();
        } else {
          plain_loop(n);
        }
        times[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
      }
      comm.barrier();
      std::vector<double> worst(static_cast<std::size_t>(iters));
      for (int i = 0; i < iters; ++i) {
        for (int k = 0; k < p; ++k) worst[i] = std::max(worst[i], times[static_cast<std::size_t>(k)][i]);
      }
      comm.barrier();
      return median(worst);
    };
    for (Row& row : rows) {
      std::size_t const n = row.bytes / sizeof(float);
      std::int64_t iters = iterations_for(std::max({run(0, n, 1), run(1, n, 1), run(2, n, 1)}), a);
      comm.broadcast(std::span(&iters, 1), 0);  // every rank runs the same count
      double t[3] = {};
      for (int round = 0; round < 3; ++round) {  // interleave the variants against drift
        for (int v = 0; v < 3; ++v) {
          double const m = run(v, n, static_cast<int>(std::max<std::int64_t>(1, iters / 3)));
          t[v] = round == 0 ? m : std::min(t[v], m);
        }
      }
      if (r == 0) {
        row.threads = t[0];
        row.threads_async = t[1];
        row.loop = t[2];
      }
    }
    // Small-message latency: batches of back-to-back all-reduces, median batch.
    auto latency = [&](std::size_t n) {
      std::vector<double> per_op;
      for (int batch = 0; batch < 25; ++batch) {
        comm.barrier();
        auto const t0 = Clock::now();
        for (int i = 0; i < 2000; ++i) comm.all_reduce(std::span(mine).first(n), ddp::ReduceOp::kSum);
        per_op.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / 2000);
      }
      return median(per_op);
    };
    double const l4 = latency(1);
    double const l4k = latency(1024);
    if (r == 0) {
      lat4 = l4;
      lat4k = l4k;
    }
  });
}

// Other MPI ranks wait here while rank 0 runs the threads part, without MPICH's busy polling.
void idle_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::string human(std::size_t b) {
  char buf[32];
  if (b % 1'000'000 == 0)
    std::snprintf(buf, sizeof buf, "%zu MB", b / 1'000'000);
  else if (b % (1u << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", b >> 20);
  else if (b % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Args const a = parse(argc, argv);
  return ddp::mpi_main(argc, argv, [&](ddp::MpiSession& session) {
    int const p = session.world_size();
    std::vector<Row> rows;
    for (std::size_t b : sizes(a)) rows.push_back(Row{.bytes = b});
    double mpi_lat = 0;
    std::string layout;
    if (a.mpi && p > 1) {
      ddp::MpiBackend comm(session, {.node = a.node});
      ddp::MpiBackend flat(session, {.node = {.all_reduce = ddp::NodeAllReduce::kMpi}});
      ddp::MpiNodeOptions cached_node = a.node;
      cached_node.window_stores = ddp::WindowStores::kPlain;
      ddp::MpiBackend cached(session, {.node = cached_node});
      layout = comm.layout();
      bench_mpi(comm, flat, cached, a, rows);
      std::vector<float> x(1, 0.0f);
      std::vector<double> per_op;
      for (int batch = 0; batch < 5; ++batch) {  // oversubscribed MPICH polls: ms per op at 4 ranks on 2 cores
        MPI_Barrier(MPI_COMM_WORLD);
        double const t0 = MPI_Wtime();
        for (int i = 0; i < 100; ++i) comm.all_reduce(x, ddp::ReduceOp::kSum);
        per_op.push_back((MPI_Wtime() - t0) / 100);
      }
      mpi_lat = median(per_op);
    }
    double lat4 = 0, lat4k = 0;
    if (a.threads) {
      if (session.rank() == 0) bench_threads(a.threads_world > 0 ? a.threads_world : p, a, rows, lat4, lat4k);
      idle_barrier();
    }
    if (session.rank() != 0) return 0;
    if (a.threads_world > 0 && a.threads_world != p) std::printf("threads world size %d; ", a.threads_world);
    std::printf("world size %d; busbw in GB/s (median iteration, slowest rank), float32 sum\n", p);
    if (!layout.empty()) std::printf("MpiBackend all_reduce: %s\n", layout.c_str());
    std::printf(
        "\n| size | threads | threads async | plain loop | threads / loop | MpiBackend | MpiBackend async | "
        "MpiBackend kMpi | MpiBackend plain stores | MpiBackend in place | in place plain stores | "
        "raw MPI_Allreduce | window loop | MpiBackend / raw | in place / raw | in place / loop | raw / loop |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int const pt = a.threads_world > 0 ? a.threads_world : p;  // the threads part's world size
    for (Row const& row : rows) {
      auto bw = [&](double t) { return busbw_gbs(row.bytes, t, p); };
      auto tbw = [&](double t) { return busbw_gbs(row.bytes, t, pt); };
      auto ratio = [](double slow, double fast) { return fast > 0 && slow > 0 ? slow / fast : 0.0; };
      std::printf(
          "| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | "
          "%.2f | %.2f |\n",
          human(row.bytes).c_str(), tbw(row.threads), tbw(row.threads_async), tbw(row.loop),
          ratio(row.loop, row.threads), bw(row.mpi), bw(row.mpi_async), bw(row.mpi_flat), bw(row.mpi_cached),
          bw(row.mpi_in_place), bw(row.mpi_in_place_plain), bw(row.raw), bw(row.window_loop), ratio(row.raw, row.mpi),
          ratio(row.raw, row.mpi_in_place), ratio(row.window_loop, row.mpi_in_place), ratio(row.window_loop, row.raw));
    }
    std::printf("\nlatency: threads all_reduce 4 B %.2f us, 4 KiB %.2f us; MpiBackend 4 B %.2f us\n", lat4 * 1e6,
                lat4k * 1e6, mpi_lat * 1e6);
    std::printf(
        "%s times: threads %.1f ms, plain loop %.1f ms, MpiBackend %.1f ms (plain stores %.1f ms), raw MPI %.1f ms\n",
        human(rows.back().bytes).c_str(), rows.back().threads * 1e3, rows.back().loop * 1e3, rows.back().mpi * 1e3,
        rows.back().mpi_cached * 1e3, rows.back().raw * 1e3);
    return 0;
  });
}

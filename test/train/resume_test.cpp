// Resuming from a checkpoint on the threads backend: another bucket plan at the same world size is bitwise
// the uninterrupted run; another world size (DDP ranks <-> one process with a plain arena, 2 <-> 4 ranks)
// matches it to 1e-6. The same scenarios run under mpirun in resume_mpi_main.cpp.
#include <doctest/doctest.h>

#include <mutex>

#include "test/train/resume_cases.hpp"
#include "test/train/testing.hpp"

using namespace ddp;
using namespace ddp::test::resume;
namespace fs = std::filesystem;

namespace {

// Runs `leg` of the MLP under DDP on `world` thread ranks; checks every rank holds the same bits; returns them.
std::vector<float> mlp_on(int world, Leg const& leg) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(world));
  spawn(world, [&](ThreadsBackend& comm) {
    out[static_cast<std::size_t>(comm.rank())] = ddp_leg<optim::AdamW>(comm, leg, make_mlp, kMlpInput, 4);
  });
  for (auto const& o : out) CHECK(same_bits(o, out[0]));
  return out[0];
}
}  // namespace

TEST_CASE("resuming with another bucket plan at the same world size is bitwise the uninterrupted run") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<double> diff(static_cast<std::size_t>(n), -1);
    spawn(n, [&](ThreadsBackend& comm) {
      auto const dir = shared_temp_dir(comm, "resume_buckets");
      diff[static_cast<std::size_t>(comm.rank())] = resume_with_other_buckets(comm, dir);
    });
    for (double d : diff) CHECK(d == 0.0);
  }
}

TEST_CASE("resuming at another world size: DDP ranks <-> one process with a plain arena, to 1e-6") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<double> diff(static_cast<std::size_t>(n), -1);
    spawn(n, [&](ThreadsBackend& comm) {
      auto const dir = shared_temp_dir(comm, "resume_world");
      diff[static_cast<std::size_t>(comm.rank())] = resume_with_one_process(comm, dir);
    });
    for (double d : diff) CHECK(d <= 1e-6);
  }
}

TEST_CASE("resuming at another world size: 2 ranks -> 4 ranks and 4 -> 2, other bucket plans, to 1e-6") {
  auto const dir = test::temp_dir("resume_test", "world_2_4");
  auto const full = plain_leg<optim::AdamW>({}, make_mlp, kMlpInput, 4);
  for (auto [from, to] : {std::pair{2, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
    CAPTURE(from);
    CAPTURE(to);
    auto const ckpt = dir / ("from" + std::to_string(from) + ".ckpt");
    mlp_on(from, {.to = kStop, .save = ckpt, .buckets = kOneBucket});
    auto const resumed = mlp_on(to, {.from = kStop, .load = ckpt, .buckets = kSmallBuckets, .seed = 7});
    CHECK(relative_diff(resumed, full) <= 1e-6);
    CHECK(relative_diff(resumed, full) > 0);  // (a different reduction order, not a copy of something)
  }
}

TEST_CASE(
    "a checkpoint keeps every rank's generators; at another world size parameters and buffers load, generators keep "
    "their seeds") {
  auto const dir = test::temp_dir("resume_test", "generators");
  auto const ckpt = dir / "cnn.ckpt";
  std::vector<GeneratorState> saved(2);
  spawn(2, [&](ThreadsBackend& comm) {
    ddp_leg<optim::AdamW>(comm, {.to = kStop, .save = ckpt}, make_cnn, kCnnInput, 3);
    saved[static_cast<std::size_t>(comm.rank())] = make_cnn(1, comm.rank()).get<4>().generator().state();
  });
  auto const c = read_checkpoint_file<float>(ckpt);
  CHECK(c.position.world_size == 2);
  REQUIRE(c.generators.names == std::vector<std::string>{"drop.generator"});
  REQUIRE(c.generators.ranks.size() == 2);
  CHECK(c.generators.ranks[0][0] != c.generators.ranks[1][0]);  // each rank's own stream, both advanced
  CHECK(c.generators.ranks[0][0] != saved[0]);
  CHECK(c.buffers.size() == 2);
  // On 4 ranks: parameters and buffers are the file's; the generators keep the seeds they were built with.
  spawn(4, [&](ThreadsBackend& comm) {
    auto model = make_cnn(9, comm.rank());
    DistributedDataParallel ddp(model, comm);
    optim::AdamW opt(ddp.parameters(), {});
    auto const fresh = model.get<4>().generator().state();
    load_checkpoint(ckpt, comm, model, opt);
    CHECK(model.get<4>().generator().state() == fresh);
    auto const params = model.named_parameters();
    for (std::size_t i = 0; i < params.size(); ++i)
      CHECK(std::memcmp(params[i].var.value().data(), c.parameters[i].values.data(),
                        c.parameters[i].values.size() * sizeof(float)) == 0);
    auto const buffers = model.named_buffers();
    for (std::size_t i = 0; i < buffers.size(); ++i)
      CHECK(std::memcmp(buffers[i].tensor.data(), c.buffers[i].values.data(),
                        c.buffers[i].values.size() * sizeof(float)) == 0);
  });
  // On 2 ranks again: each rank continues its own stream.
  spawn(2, [&](ThreadsBackend& comm) {
    auto model = make_cnn(9, comm.rank());
    DistributedDataParallel ddp(model, comm);
    optim::AdamW opt(ddp.parameters(), {});
    load_checkpoint(ckpt, comm, model, opt);
    CHECK(model.get<4>().generator().state() == c.generators.ranks[static_cast<std::size_t>(comm.rank())][0]);
  });
}

// Checkpoints: round trip of every field (parameters, frozen ones too, buffers, per-parameter optimizer state,
// generators), atomic writes, corrupted/truncated/foreign/old/mismatched files are clear errors on every rank,
// and resuming (threads, 2 ranks, real Fashion-MNIST slice) is bitwise exact. Resuming with another bucket
// plan or world size: resume_test.cpp.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/data/fashion_mnist.hpp>
#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint.hpp>

#include "test/train/testing.hpp"

using namespace ddp;
namespace fs = std::filesystem;

namespace {

std::string slurp(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
using test::dump;

auto small_model(std::uint64_t seed, std::int64_t hidden = 3) {
  Generator g(seed);
  return nn::Sequential(nn::named("fc1", nn::Linear(4, hidden, g)), nn::ReLU(),
                        nn::named("fc2", nn::Linear(hidden, 2, g)));
}

template <class M, class O>
void take_steps(M& model, O& opt, int steps) {
  Generator g(7);
  Tensor<float> x(Shape{5, 4}), y(Shape{5, 2});
  for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = g.uniform(-1.0f, 1.0f);
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    backward(mse_loss(model(Var(x)), y));
    opt.step();
  }
}

std::vector<float> values_of(nn::ParameterArena<float> const& a) {
  std::vector<float> v;
  for (auto const& e : a.entries())
    v.insert(v.end(), a.values().data() + e.offset, a.values().data() + e.offset + e.numel);
  return v;
}

bool same_bits(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TrainPosition const kPos{.epoch = 3,
                         .step = 17,
                         .global_step = 1234,
                         .scheduler_epoch = 2,
                         .world_size = 4,
                         .global_batch = 256,
                         .seed = 99};

// A valid checkpoint of small_model after 3 AdamW steps, written to dir/name.
fs::path write_valid(fs::path const& dir, std::string const& name = "ckpt.bin") {
  auto m = small_model(1);
  nn::ParameterArena<float> arena(m);
  optim::AdamW opt(arena, {.lr = 0.01});
  take_steps(m, opt, 3);
  auto const path = dir / name;
  write_checkpoint_file(path, capture_checkpoint(m, opt, kPos));
  return path;
}

// Runs load_checkpoint on `world` thread ranks and returns each rank's error message ("" when it loaded).
template <class MakeModel>
std::vector<std::string> load_on_ranks(int world, fs::path const& path, MakeModel make, bool sgd_on_rank1 = false) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::mutex mu;
  spawn(world, [&](ThreadsBackend& comm) {
    auto m = make(comm.rank());
    nn::ParameterArena<float> arena(m);
    std::string err;
    try {
      if (sgd_on_rank1 && comm.rank() == 1) {
        optim::SGD opt(arena, {.lr = 0.1, .momentum = 0.9});
        load_checkpoint(path, comm, m, opt);
      } else {
        optim::AdamW opt(arena, {});
        load_checkpoint(path, comm, m, opt);
      }
    } catch (Error const& e) {
      err = e.what();
      if (err.empty()) err = "(empty message)";
    }
    std::lock_guard lock(mu);
    errors[static_cast<std::size_t>(comm.rank())] = err;
  });
  return errors;
}

}  // namespace

TEST_CASE("checkpoint round trip keeps every field: parameters, optimizer state per parameter, position") {
  auto const dir = test::temp_dir("checkpoint_test", "roundtrip");
  auto m = small_model(1);
  nn::ParameterArena<float> arena(m);
  optim::AdamW opt(arena, {.lr = 0.01});
  take_steps(m, opt, 3);
  opt.set_lr(0.0042);
  auto const path = dir / "ckpt.bin";
  auto const saved = capture_checkpoint(m, opt, kPos, std::string("caller's bytes\0\xff", 16));
  write_checkpoint_file(path, saved);
  CHECK(encode_checkpoint(saved) == slurp(path));  // deterministic bytes

  auto const c = read_checkpoint_file<float>(path);
  CHECK(c.position == kPos);
  CHECK(c.extra == std::string("caller's bytes\0\xff", 16));
  REQUIRE(c.parameters.size() == 4);
  CHECK(c.parameters[0].name == "fc1.weight");
  CHECK(c.parameters[0].shape == std::vector<std::int64_t>{3, 4});
  CHECK(c.parameters[3].name == "fc2.bias");
  CHECK(c.parameters[3].shape == std::vector<std::int64_t>{2});
  std::vector<float> flat;
  for (auto const& p : c.parameters) flat.insert(flat.end(), p.values.begin(), p.values.end());
  CHECK(same_bits(flat, values_of(arena)));
  CHECK(c.buffers.empty());
  CHECK(c.generators.names.empty());
  auto const st = opt.state();
  CHECK(c.optimizer.kind == "adamw");
  CHECK(c.optimizer.lr == 0.0042);
  CHECK(c.optimizer.buffer_names == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  REQUIRE(c.optimizer.parameters.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(c.optimizer.parameters[i].name == c.parameters[i].name);
    CHECK(c.optimizer.parameters[i].shape == c.parameters[i].shape);
    CHECK(c.optimizer.parameters[i].steps == 3);
    for (std::size_t b = 0; b < 2; ++b)
      CHECK(same_bits(c.optimizer.parameters[i].buffers[b], st.parameters[i].buffers[b]));
  }

  // Into a fresh model (other initial weights) and optimizer, through the collective loader (1 rank).
  spawn(1, [&](ThreadsBackend& comm) {
    auto m2 = small_model(12345);
    nn::ParameterArena<float> arena2(m2);
    optim::AdamW opt2(arena2, {.lr = 1.0});
    CHECK_FALSE(same_bits(values_of(arena2), values_of(arena)));
    std::string extra;
    auto const pos = load_checkpoint(path, comm, m2, opt2, &extra);
    CHECK(pos == kPos);
    CHECK(extra == c.extra);
    CHECK(same_bits(values_of(arena2), values_of(arena)));
    CHECK(opt2.state() == st);
    // The next step is the same as the original's next step.
    take_steps(m, opt, 1);
    take_steps(m2, opt2, 1);
    CHECK(same_bits(values_of(arena2), values_of(arena)));
  });
}

TEST_CASE("checkpoint write is atomic: temp file renamed over the old one, nothing left behind") {
  auto const dir = test::temp_dir("checkpoint_test", "atomic");
  auto const path = write_valid(dir);
  auto const first = slurp(path);
  dump(dir / "other", "x");
  // Overwrite with a different checkpoint: the file is replaced whole.
  auto m = small_model(2);
  nn::ParameterArena<float> arena(m);
  optim::SGD opt(arena, {.lr = 0.1});
  write_checkpoint_file(path, capture_checkpoint(m, opt, TrainPosition{.epoch = 1}));
  CHECK(slurp(path) != first);
  CHECK(read_checkpoint_file<float>(path).optimizer.kind == "sgd");
  int entries = 0;
  for (auto const& e : fs::directory_iterator(dir)) {
    ++entries;
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
  }
  CHECK(entries == 2);
  // A missing directory is an IoError naming the file; no partial file appears.
  auto const bad = dir / "missing" / "ckpt.bin";
  CHECK_THROWS_WITH_AS(write_checkpoint_file(bad, capture_checkpoint(m, opt, {})),
                       doctest::Contains(bad.string().c_str()), IoError);
  CHECK_FALSE(fs::exists(bad));
}

TEST_CASE("a corrupted checkpoint (one flipped byte) is a checksum error naming the file") {
  auto const dir = test::temp_dir("checkpoint_test", "corrupt");
  auto const path = write_valid(dir);
  auto const good = slurp(path);
  for (std::size_t at : {kCheckpointHeaderBytes + 20, good.size() / 2, good.size() - 1}) {
    CAPTURE(at);
    auto bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x01);
    dump(path, bad);
    CHECK_THROWS_WITH_AS(read_checkpoint_file<float>(path),
                         doctest::Contains(("checkpoint " + path.string() + ": checksum mismatch").c_str()), IoError);
  }
  // A flipped bit in the header (here: the payload length) is caught by the header's own checksum.
  auto bad = good;
  bad[16] = static_cast<char>(bad[16] ^ 0x04);
  dump(path, bad);
  CHECK_THROWS_WITH_AS(read_checkpoint_file<float>(path), doctest::Contains("header's checksum does not match"),
                       IoError);
}

TEST_CASE("a truncated checkpoint is an error naming the file and the sizes") {
  auto const dir = test::temp_dir("checkpoint_test", "truncated");
  auto const path = write_valid(dir);
  auto const good = slurp(path);
  for (std::size_t n : {std::size_t{0}, std::size_t{7}, kCheckpointHeaderBytes - 1}) {
    CAPTURE(n);
    dump(path, good.substr(0, n));
    CHECK_THROWS_WITH_AS(
        read_checkpoint_file<float>(path),
        doctest::Contains(
            ("checkpoint " + path.string() + ": truncated: the file has " + std::to_string(n) + " bytes").c_str()),
        IoError);
  }
  for (std::size_t n : {kCheckpointHeaderBytes, good.size() / 2, good.size() - 1}) {
    CAPTURE(n);
    dump(path, good.substr(0, n));
    CHECK_THROWS_WITH_AS(
        read_checkpoint_file<float>(path),
        doctest::Contains(("truncated: the header announces " + std::to_string(good.size() - kCheckpointHeaderBytes) +
                           " payload bytes but only " + std::to_string(n - kCheckpointHeaderBytes) + " follow it")
                              .c_str()),
        IoError);
  }
  dump(path, good + "junk");
  CHECK_THROWS_WITH_AS(read_checkpoint_file<float>(path), doctest::Contains("4 unexpected bytes after"), IoError);
  CHECK_THROWS_WITH_AS(read_checkpoint_file<float>(dir / "nope.bin"), doctest::Contains("nope.bin does not exist"),
                       IoError);
}

TEST_CASE("wrong magic or version is an error naming the file") {
  auto const dir = test::temp_dir("checkpoint_test", "magic");
  auto const path = write_valid(dir);
  auto const good = slurp(path);
  auto bad = good;
  bad[0] = 'X';
  dump(path, bad);
  CHECK_THROWS_WITH_AS(
      read_checkpoint_file<float>(path),
      doctest::Contains((path.string() + ": wrong magic number: this is not a ddp checkpoint").c_str()), IoError);
  dump(path, std::string(100, 'a'));
  CHECK_THROWS_WITH_AS(read_checkpoint_file<float>(path), doctest::Contains("wrong magic number"), IoError);
  // Version 3 with a consistent header checksum: refused as unsupported.
  bad = good;
  std::uint32_t const v3 = 3;
  std::memcpy(bad.data() + 8, &v3, 4);
  std::uint32_t const crc = detail::crc32_of(bad.data(), kCheckpointHeaderBytes - 4);
  std::memcpy(bad.data() + kCheckpointHeaderBytes - 4, &crc, 4);
  dump(path, bad);
  CHECK_THROWS_WITH_AS(
      read_checkpoint_file<float>(path),
      doctest::Contains((path.string() + ": unsupported version 3 (this build reads version 2)").c_str()), IoError);
  // Double-precision parameters are not float parameters.
  CHECK_THROWS_WITH_AS(read_checkpoint_file<double>(write_valid(dir, "f.bin")),
                       doctest::Contains("4-byte elements, this model uses 8-byte elements"), IoError);
}

TEST_CASE("a checkpoint of another model or optimizer is an ArgumentError on every rank, naming the difference") {
  auto const dir = test::temp_dir("checkpoint_test", "mismatch");
  auto const path = write_valid(dir);

  SUBCASE("different hidden size on every rank") {
    auto const errs = load_on_ranks(2, path, [](int) { return small_model(1, 5); });
    for (auto const& e : errs) {
      CHECK(e.find("checkpoint " + path.string() + " does not fit this model/optimizer") != std::string::npos);
      CHECK(e.find("parameter 'fc1.weight' is (3, 4) in the file but (5, 4) in the model") != std::string::npos);
    }
  }
  SUBCASE("only rank 1's model differs: both ranks fail (no hang), rank 0 is told who reported it") {
    auto const errs = load_on_ranks(2, path, [](int r) { return small_model(1, r == 1 ? 6 : 3); });
    CHECK(errs[1].find("(6, 4) in the model") != std::string::npos);
    CHECK(errs[0].find("(6, 4) in the model") != std::string::npos);
    CHECK(errs[0].find("reported by rank 1") != std::string::npos);
  }
  SUBCASE("wrong optimizer kind on rank 1") {
    auto const errs = load_on_ranks(
        2, path, [](int) { return small_model(1); }, /*sgd_on_rank1=*/true);
    for (auto const& e : errs)
      CHECK(e.find("its optimizer state does not fit: the optimizer state is for 'adamw', not 'sgd'") !=
            std::string::npos);
  }
  SUBCASE("a fitting model loads on both ranks") {
    auto const errs = load_on_ranks(2, path, [](int) { return small_model(5); });
    CHECK(errs[0].empty());
    CHECK(errs[1].empty());
  }
  SUBCASE("a corrupted file fails on both ranks with rank 0's message") {
    auto bytes = slurp(path);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
    dump(path, bytes);
    auto const errs = load_on_ranks(2, path, [](int) { return small_model(1); });
    for (auto const& e : errs) CHECK(e.find("checksum mismatch") != std::string::npos);
    CHECK(errs[1].find("read by rank 0; this is rank 1") != std::string::npos);
  }
  SUBCASE("the error family survives: a mismatch is an ArgumentError, a bad file an IoError") {
    spawn(2, [&](ThreadsBackend& comm) {
      auto m = small_model(1, 5);
      nn::ParameterArena<float> arena(m);
      optim::AdamW opt(arena, {});
      CHECK_THROWS_AS(load_checkpoint(path, comm, m, opt), ArgumentError);
      CHECK_THROWS_AS(load_checkpoint(dir / "absent.bin", comm, m, opt), IoError);
    });
  }
}

TEST_CASE("a failed save is an IoError on every rank") {
  auto const dir = test::temp_dir("checkpoint_test", "savefail");
  std::vector<std::string> errs(2);
  std::mutex mu;
  spawn(2, [&](ThreadsBackend& comm) {
    auto m = small_model(1);
    nn::ParameterArena<float> arena(m);
    optim::AdamW opt(arena, {});
    std::string err;
    try {
      save_checkpoint(dir / "no" / "such" / "dir.bin", comm, m, opt, kPos);
    } catch (IoError const& e) {
      err = e.what();
    }
    std::lock_guard lock(mu);
    errs[static_cast<std::size_t>(comm.rank())] = err;
  });
  for (auto const& e : errs)
    CHECK(e.find("cannot write checkpoint " + (dir / "no/such/dir.bin").string()) != std::string::npos);
  CHECK(errs[1].find("reported by rank 0") != std::string::npos);
}

TEST_CASE("a checkpoint written before 2026-12 (the epoch's loss in a LOSS section) still reads") {
  // Written by git f8a9ec5's encoder: position only, and two ranks' epoch loss with the step fields since dropped.
  fs::path const old = "test/train/testdata/checkpoint_v2_loss.bin";
  REQUIRE(fs::exists(old));
  auto const c = read_checkpoint_file<float>(old);
  REQUIRE(c.epoch_loss.size() == 2);
  CHECK(c.epoch_loss[0].train == Counts{.correct = 0, .total = 24, .loss_sum = 20.0});
  CHECK(c.epoch_loss[1].train == Counts{.correct = 0, .total = 24, .loss_sum = 18.0});
  CHECK(c.position.step == 3);
  // Written again, the loss goes to an ELOS section and reads back the same.
  CHECK(decode_checkpoint<float>(encode_checkpoint(c), "again").epoch_loss == c.epoch_loss);
}

TEST_CASE("a version-1 checkpoint (optimizer state in bucket layout) is refused, naming the file and the version") {
  // Written by the version-1 code (git 6530216) for small_model(1) after 3 AdamW steps.
  fs::path const v1 = "test/train/testdata/checkpoint_v1.bin";
  REQUIRE(fs::exists(v1));
  CHECK_THROWS_WITH_AS(
      read_checkpoint_file<float>(v1),
      doctest::Contains("checkpoint test/train/testdata/checkpoint_v1.bin: format version 1 is no longer "
                        "read (this build reads version 2)"),
      IoError);
  auto const errs = load_on_ranks(2, v1, [](int) { return small_model(1); });
  for (auto const& e : errs) CHECK(e.find("checkpoint_v1.bin: format version 1") != std::string::npos);
}

TEST_CASE("a generator's state continues its sequence bit for bit, normal()'s spare value included") {
  Generator g(42, 7);
  (void)g.normal();  // leaves a spare
  auto const st = g.state();
  CHECK(st.has_spare);
  Generator h(1);
  h.set_state(st);
  CHECK(h.state() == st);
  for (int i = 0; i < 5; ++i) CHECK(h.normal() == g.normal());
  std::uint32_t a[40], b[40];
  g.fill_u32(a, 40);
  h.fill_u32(b, 40);
  CHECK(std::memcmp(a, b, sizeof a) == 0);
}

namespace {

// Conv, BatchNorm (running statistics are buffers), Dropout (a generator), Linear: state beyond parameters.
auto stateful_model(std::uint64_t seed, std::uint64_t dropout_seed) {
  Generator g(seed);
  return nn::Sequential(nn::named("conv", nn::Conv2d(1, 2, 3, g)), nn::named("bn", nn::BatchNorm2d(2)), nn::ReLU(),
                        nn::Flatten(), nn::named("drop", nn::Dropout(0.3, dropout_seed)),
                        nn::named("fc", nn::Linear(2 * 4 * 4, 3, g)));
}
template <class M, class O>
void take_image_steps(M& model, O& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    Generator g(100 + static_cast<std::uint64_t>(s));
    Tensor<float> x(Shape{4, 1, 6, 6}), y(Shape{4, 3});
    for (std::int64_t i = 0; i < x.numel(); ++i) x[i] = g.uniform(-1.0f, 1.0f);
    for (std::int64_t i = 0; i < y.numel(); ++i) y[i] = g.uniform(-1.0f, 1.0f);
    opt.zero_grad();
    backward(mse_loss(model(Var(x)), y));
    opt.step();
  }
}
template <class M>
std::vector<float> everything_of(M const& model) {  // parameters and buffers, in the model's order
  std::vector<float> v;
  for (auto const& p : model.named_parameters())
    v.insert(v.end(), p.var.value().data(), p.var.value().data() + p.var.numel());
  for (auto const& b : model.named_buffers()) v.insert(v.end(), b.tensor.data(), b.tensor.data() + b.tensor.numel());
  return v;
}

}  // namespace

TEST_CASE("buffers (BatchNorm running statistics) and Dropout's generator are saved and restored: exact resume") {
  auto const dir = test::temp_dir("checkpoint_test", "buffers");
  auto full = stateful_model(1, 5);
  nn::ParameterArena<float> fa(full);
  optim::Adam fo(fa, {.lr = 0.01});
  take_image_steps(full, fo, 0, 3);
  auto const path = dir / "ckpt.bin";
  write_checkpoint_file(path, capture_checkpoint(full, fo, kPos));
  auto const c = read_checkpoint_file<float>(path);
  REQUIRE(c.buffers.size() == 2);
  CHECK(c.buffers[0].name == "bn.running_mean");
  CHECK(c.buffers[1].name == "bn.running_var");
  CHECK(c.buffers[1].shape == std::vector<std::int64_t>{2});
  CHECK(c.buffers[0].values != std::vector<float>{0.0f, 0.0f});  // three training steps moved them
  CHECK(c.generators.names == std::vector<std::string>{"drop.generator"});
  REQUIRE(c.generators.ranks.size() == 1);
  CHECK(c.generators.ranks[0][0] == full.get<4>().generator().state());
  take_image_steps(full, fo, 3, 6);

  // Another initial model, fresh running statistics, another dropout seed: all of it comes from the file.
  auto resumed = stateful_model(2, 77);
  nn::ParameterArena<float> ra(resumed);
  optim::Adam ro(ra, {.lr = 0.5});
  spawn(1, [&](ThreadsBackend& comm) { CHECK(load_checkpoint(path, comm, resumed, ro) == kPos); });
  take_image_steps(resumed, ro, 3, 6);
  CHECK(same_bits(everything_of(resumed), everything_of(full)));
  CHECK(resumed.get<4>().generator().state() == full.get<4>().generator().state());
}

TEST_CASE("frozen parameters are saved and restored; the optimizer keeps no state for them") {
  auto const dir = test::temp_dir("checkpoint_test", "frozen");
  auto make = [](std::uint64_t seed) {
    auto m = small_model(seed);
    m.get<0>().weight.node().requires_grad = false;  // fc1.weight frozen
    return m;
  };
  auto trainable = [](auto const& m) {
    auto ps = m.named_parameters();
    std::erase_if(ps, [](auto const& p) { return !p.var.requires_grad(); });
    return nn::ParameterArena<float>(ps);
  };
  auto m = make(1);
  auto arena = trainable(m);
  optim::SGD opt(arena, {.lr = 0.1, .momentum = 0.9});
  take_steps(m, opt, 2);
  auto const path = dir / "ckpt.bin";
  write_checkpoint_file(path, capture_checkpoint(m, opt, kPos));
  auto const c = read_checkpoint_file<float>(path);
  CHECK(c.parameters.size() == 4);            // the frozen one included
  CHECK(c.optimizer.parameters.size() == 3);  // not in the optimizer
  auto m2 = make(9);
  auto arena2 = trainable(m2);
  optim::SGD opt2(arena2, {.lr = 0.1, .momentum = 0.9});
  spawn(1, [&](ThreadsBackend& comm) { load_checkpoint(path, comm, m2, opt2); });
  take_steps(m, opt, 2);
  take_steps(m2, opt2, 2);
  CHECK(same_bits(everything_of(m2), everything_of(m)));
}

TEST_CASE("parameters, buffers and generators are matched by name: a missing or extra one is named") {
  auto const dir = test::temp_dir("checkpoint_test", "names");
  auto m = stateful_model(1, 5);
  nn::ParameterArena<float> arena(m);
  optim::SGD opt(arena, {.lr = 0.1});
  auto const path = dir / "ckpt.bin";
  write_checkpoint_file(path, capture_checkpoint(m, opt, kPos));
  auto const c = read_checkpoint_file<float>(path);
  auto fits = [&](CheckpointData<float> const& d) { check_checkpoint_fits(d, m, opt, "f.bin"); };
  CHECK_NOTHROW(fits(c));
  auto d = c;
  std::swap(d.parameters[0], d.parameters[3]);  // order does not matter
  std::swap(d.optimizer.parameters[0], d.optimizer.parameters[2]);
  CHECK_NOTHROW(fits(d));
  d = c;
  d.buffers.pop_back();
  CHECK_THROWS_WITH_AS(fits(d),
                       doctest::Contains("checkpoint f.bin does not fit this model/optimizer: the model's buffer "
                                         "'bn.running_var' (2,) is not in the file"),
                       ArgumentError);
  d = c;
  d.parameters[2].name = "bn.scale";
  CHECK_THROWS_WITH_AS(fits(d), doctest::Contains("the model's parameter 'bn.weight' (2,) is not in the file"),
                       ArgumentError);
  d = c;
  d.parameters.push_back(d.parameters[0]);
  d.parameters.back().name = "head.weight";
  CHECK_THROWS_WITH_AS(
      fits(d), doctest::Contains("it holds parameter 'head.weight' (2, 1, 3, 3), which the model does not have"),
      ArgumentError);
  d = c;
  d.optimizer.parameters.pop_back();
  CHECK_THROWS_WITH_AS(
      fits(d), doctest::Contains("its optimizer state does not fit: sgd state has no entry for parameter 'fc.bias'"),
      ArgumentError);
  d = c;
  d.generators.names[0] = "dropout.generator";
  CHECK_THROWS_WITH_AS(fits(d), doctest::Contains("the model's random generator 'drop.generator' is not in the file"),
                       ArgumentError);
}

// ---- resume equals uninterrupted -----------------------------------------------------------------------

namespace {

// Trains the example's MLP (784-256-128-10) with DDP on 2 thread ranks, AdamW and StepLR, for `epochs` over
// `data` (global batch 64, shuffled per epoch). With `resume`, starts from that checkpoint; with
// `stop_at` > 0, saves to `save` after that many optimizer steps and stops. Returns rank 0's weights (and
// checks rank 1 holds the same bits).
std::vector<float> train_mlp(TensorDataset<std::int32_t> const& data, std::int64_t epochs, std::uint64_t init_seed,
                             fs::path const& resume, std::int64_t stop_at, fs::path const& save) {
  std::vector<std::vector<float>> out(2);
  spawn(2, [&](ThreadsBackend& comm) {
    Generator g(init_seed);
    nn::Sequential model(nn::Flatten(), nn::named("fc1", nn::Linear(784, 256, g)), nn::ReLU(),
                         nn::named("fc2", nn::Linear(256, 128, g)), nn::ReLU(),
                         nn::named("fc3", nn::Linear(128, 10, g)));
    DistributedDataParallel ddp(model, comm);
    optim::AdamW opt(ddp.parameters(), {.lr = 2e-3});
    optim::StepLR sched(opt, {.step_size = 1, .gamma = 0.5});
    TrainPosition pos{.world_size = 2, .global_batch = 64, .seed = 5};
    if (!resume.empty()) pos = load_checkpoint(resume, comm, ddp.module(), opt);
    sched.set_epoch(pos.scheduler_epoch);
    DistributedSampler sampler(static_cast<std::int64_t>(data.size()), comm, {.seed = 5});
    for (std::int64_t epoch = pos.epoch; epoch < epochs; ++epoch) {
      sampler.set_epoch(epoch);
      DataLoader loader(data, sampler, {.batch_size = 32});
      std::int64_t step = pos.step;
      for (auto const& b : loader.from(pos.step)) {
        opt.zero_grad();
        backward(cross_entropy(ddp(Var(b.x)), b.y));
        opt.step();
        ++step;
        if (++pos.global_step == stop_at) {
          save_checkpoint(save, comm, ddp.module(), opt,
                          {.epoch = epoch,
                           .step = step,
                           .global_step = pos.global_step,
                           .scheduler_epoch = sched.epoch(),
                           .world_size = 2,
                           .global_batch = 64,
                           .seed = 5});
          out[static_cast<std::size_t>(comm.rank())] = values_of(ddp.parameters());
          return;
        }
      }
      pos.step = 0;
      sched.step();
    }
    out[static_cast<std::size_t>(comm.rank())] = values_of(ddp.parameters());
  });
  CHECK(same_bits(out[0], out[1]));
  return out[0];
}

}  // namespace

TEST_CASE("resuming from a checkpoint gives bitwise the weights of an uninterrupted run (threads, 2 ranks)") {
  auto const data = FashionMnist::load({.split = Split::kTrain, .limit = 512});  // 8 steps per epoch
  auto const dir = test::temp_dir("checkpoint_test", "resume");
  auto const full = train_mlp(data, 3, 1, {}, 0, {});
  // Stop mid-epoch (step 5 of epoch 1, i.e. the 13th step) and at an epoch boundary (after epoch 0).
  for (std::int64_t stop : {13, 8, 3}) {
    CAPTURE(stop);
    auto const ckpt = dir / ("stop" + std::to_string(stop) + ".bin");
    auto const partial = train_mlp(data, 3, 1, {}, stop, ckpt);
    CHECK_FALSE(same_bits(partial, full));
    auto const pos = read_checkpoint_file<float>(ckpt).position;
    CHECK(pos.global_step == stop);
    CHECK(pos.epoch * 8 + pos.step == stop);
    // A fresh process state: other initial weights (DDP would broadcast them), new optimizer, new sampler.
    auto const resumed = train_mlp(data, 3, 999, ckpt, 0, {});
    CHECK(same_bits(resumed, full));
  }
}

// Hostile checkpoint files: every section's counts, lengths and values are validated before anything is
// allocated for them, and the error names the file, the section and the field; non-regular files (/dev/zero,
// FIFOs, directories) and files that are not checkpoints are refused after reading at most their 32-byte header.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint.hpp>

#include "test/train/testing.hpp"

using namespace ddp;
namespace fs = std::filesystem;

namespace {

using test::dump;

// A valid checkpoint: two parameters, Adam-like state, one generator on two ranks.
CheckpointData<float> valid_data() {
  CheckpointData<float> c;
  c.position = {.epoch = 2, .step = 3, .global_step = 40, .scheduler_epoch = 2, .world_size = 2, .global_batch = 8};
  c.parameters = {{"w", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {2}, {7, 8}}};
  c.optimizer.kind = "adam";
  c.optimizer.lr = 0.01;
  c.optimizer.buffer_names = {"exp_avg", "exp_avg_sq"};
  c.optimizer.parameters = {{"w", {2, 3}, 40, {std::vector<float>(6, 0.5f), std::vector<float>(6, 0.25f)}},
                            {"b", {2}, 40, {std::vector<float>(2, 0.5f), std::vector<float>(2, 0.25f)}}};
  c.generators.names = {"drop.generator"};
  c.generators.ranks = {{GeneratorState{1, 3, 0.5, true}}, {GeneratorState{2, 5, 0.0, false}}};
  return c;
}

// One section as stored: tag, reserved word, length, body.
struct Sec {
  std::string tag;
  std::string body;
  std::uint32_t reserved = 0;
};

// The sections of a checkpoint's bytes (which must be valid).
std::vector<Sec> split(std::string const& bytes) {
  std::vector<Sec> out;
  std::size_t at = kCheckpointHeaderBytes;
  while (at < bytes.size()) {
    std::uint64_t len = 0;
    std::memcpy(&len, bytes.data() + at + 8, 8);
    out.push_back({bytes.substr(at, 4), bytes.substr(at + 16, len)});
    at += 16 + len;
  }
  return out;
}

// Assembles sections into a checkpoint with correct checksums, so that only the section content is wrong.
std::string assemble(std::vector<Sec> const& secs) {
  detail::ByteWriter p;
  for (auto const& s : secs) {
    p.bytes() += s.tag;
    p.put(s.reserved);
    p.put(static_cast<std::uint64_t>(s.body.size()));
    p.bytes() += s.body;
  }
  detail::ByteWriter h;
  h.bytes().append(kCheckpointMagic, sizeof kCheckpointMagic);
  h.put(kCheckpointVersion);
  h.put(static_cast<std::uint32_t>(secs.size()));
  h.put(static_cast<std::uint64_t>(p.bytes().size()));
  h.put(detail::crc32_of(p.bytes().data(), p.bytes().size()));
  h.put(detail::crc32_of(h.bytes().data(), h.bytes().size()));
  return h.bytes() + p.bytes();
}

// The valid checkpoint with section `tag`'s body replaced.
std::string with_section(std::string const& tag, std::string const& body) {
  auto secs = split(encode_checkpoint(valid_data()));
  for (auto& s : secs)
    if (s.tag == tag) s.body = body;
  return assemble(secs);
}

// The error decode_checkpoint<float> throws for `bytes` (which must be an IoError) when read from file "f.ckpt".
std::string decode_error(std::string const& bytes) {
  try {
    (void)decode_checkpoint<float>(bytes, "f.ckpt");
  } catch (IoError const& e) {
    return e.what();
  } catch (std::exception const& e) {
    FAIL("expected IoError, got: ", e.what());
  }
  FAIL("expected IoError, nothing was thrown");
  return {};
}

std::string read_error(fs::path const& p) {
  try {
    (void)read_checkpoint_file<float>(p);
  } catch (IoError const& e) {
    return e.what();
  } catch (std::exception const& e) {
    FAIL("expected IoError, got: ", e.what());
  }
  FAIL("expected IoError, nothing was thrown");
  return {};
}

// A PARM/BUFS body with one tensor of the given shape and `values` floats.
std::string tensors_body(std::uint32_t count, std::vector<std::int64_t> const& shape, std::size_t values) {
  detail::ByteWriter s;
  s.put(count);
  s.put_string("w");
  s.put(static_cast<std::uint32_t>(shape.size()));
  for (auto d : shape) s.put(d);
  for (std::size_t i = 0; i < values; ++i) s.put(1.0f);
  return s.bytes();
}

// An OPTM body: kind, lr, buffer names, then one parameter "w" (2,) with `steps` and its buffers.
std::string optm_body(double lr, std::int64_t steps, std::uint32_t nbuffers = 1) {
  detail::ByteWriter s;
  s.put_string("sgd");
  s.put(lr);
  s.put(nbuffers);
  for (std::uint32_t b = 0; b < nbuffers; ++b) s.put_string("momentum_buffer");
  s.put(std::uint32_t{1});
  s.put_string("w");
  s.put(std::uint32_t{1});
  s.put(std::int64_t{2});
  s.put(steps);
  for (std::uint32_t b = 0; b < nbuffers; ++b) {
    s.put(0.0f);
    s.put(0.0f);
  }
  return s.bytes();
}

// A META body from key/value pairs.
std::string meta_body(std::vector<std::pair<std::string, std::int64_t>> const& kv) {
  detail::ByteWriter s;
  s.put(static_cast<std::uint32_t>(kv.size()));
  for (auto const& [k, v] : kv) {
    s.put_string(k);
    s.put(v);
  }
  return s.bytes();
}
std::vector<std::pair<std::string, std::int64_t>> valid_meta() {
  return {{"epoch", 1},      {"step", 0},         {"global_step", 5}, {"scheduler_epoch", 1},
          {"world_size", 2}, {"global_batch", 8}, {"seed", -7},       {"element_bytes", 4}};
}

bool contains(std::string const& text, std::string const& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("the helpers build a valid checkpoint that decodes (the cases below change one thing)") {
  auto const bytes = assemble(split(encode_checkpoint(valid_data())));
  CHECK(bytes == encode_checkpoint(valid_data()));
  auto const c = decode_checkpoint<float>(bytes, "f.ckpt");
  CHECK(c.optimizer == valid_data().optimizer);
  CHECK(c.generators == valid_data().generators);
  CHECK(decode_checkpoint<float>(with_section("META", meta_body(valid_meta())), "f").position.seed == -7);
  CHECK(decode_checkpoint<float>(with_section("OPTM", optm_body(0.0, 0)), "f").optimizer.lr == 0.0);
}

// A checkpoint of LocalSgd/DiLoCo: two replicas of the valid checkpoint's parameters, with their optimizer states and a
// kept copy.
CheckpointData<float> valid_local_data() {
  auto c = valid_data();
  LocalRoundsState<float> l{
      .kind = "DiLoCo", .replicas = 2, .steps = 5, .syncs = 1, .names = {"w", "b"}, .numels = {6, 2}};
  for (int r = 0; r < 2; ++r) {
    l.values.push_back({std::vector<float>(6, float(r)), std::vector<float>(2, float(r))});
    l.states.push_back(c.optimizer);
  }
  l.kept = {std::vector<float>(6, 0.5f), std::vector<float>(2, 0.5f)};
  c.local = l;
  return c;
}

// A LOCL body for one parameter 'w' of `numel` values and `replicas` replicas (their values and states left out).
std::string locl_body(std::int64_t numel, std::uint32_t replicas) {
  detail::ByteWriter s;
  s.put_string("LocalSgd");
  s.put(std::int64_t{4});
  s.put(std::int64_t{3});
  s.put(std::int64_t{0});
  s.put(std::int64_t{0});
  s.put(std::uint32_t{1});
  s.put_string("w");
  s.put(numel);
  s.put(replicas);
  return s.bytes();
}

TEST_CASE("LOCL: every replica's parameters and optimizer state and the kept copy round-trip; bad counts are refused") {
  auto const c = valid_local_data();
  CHECK(decode_checkpoint<float>(encode_checkpoint(c), "f").local == c.local);
  CHECK(!decode_checkpoint<float>(encode_checkpoint(valid_data()), "f").local);
  auto with_locl = [&](std::string const& body) {
    auto secs = split(encode_checkpoint(c));
    for (auto& sec : secs)
      if (sec.tag == "LOCL") sec.body = body;
    return assemble(secs);
  };
  CHECK(decode_error(with_locl(locl_body(std::int64_t{1} << 40, 1))) ==
        "checkpoint f.ckpt: section LOCL: replica 0's 'w' values: 1099511627776 × 4 bytes announced, but only 0 bytes "
        "remain");
  CHECK(contains(decode_error(with_locl(locl_body(2, 0xFFFFFFFFu))), "section LOCL: the number of replicas"));
  CHECK(decode_error(with_locl(locl_body(2, 0))) ==
        "checkpoint f.ckpt: section LOCL: the local rounds hold no replica");
  CHECK(contains(decode_error(with_locl(locl_body(-1, 1))), "section LOCL: the size of 'w'"));
}

TEST_CASE("PARM: a parameter declaring 2^40 values in a few bytes is refused before anything is allocated") {
  auto const msg = decode_error(with_section("PARM", tensors_body(1, {1 << 20, 1 << 20}, 3)));
  CHECK(msg ==
        "checkpoint f.ckpt: section PARM: parameter 'w' (1048576, 1048576) values: 1099511627776 × 4 bytes "
        "announced, but only 12 bytes remain");
}

TEST_CASE("PARM: a parameter count of 2^32 - 1 in a 29-byte section is refused") {
  CHECK(decode_error(with_section("PARM", tensors_body(0xFFFFFFFFu, {2}, 2))) ==
        "checkpoint f.ckpt: section PARM: parameter count: 4294967295 × 8 bytes announced, but only 25 bytes remain");
}

TEST_CASE("PARM / BUFS: negative, overflowing or too many dimensions name the tensor") {
  CHECK(decode_error(with_section("PARM", tensors_body(1, {2, -1}, 0))) ==
        "checkpoint f.ckpt: section PARM: parameter 'w' has a bad dimension -1");
  CHECK(contains(decode_error(with_section("BUFS", tensors_body(1, {1 << 30, 1 << 30}, 0))),
                 "section BUFS: buffer 'w' has a bad dimension 1073741824"));
  CHECK(decode_error(with_section("PARM", tensors_body(1, std::vector<std::int64_t>(9, 1), 1))) ==
        "checkpoint f.ckpt: section PARM: parameter 'w' has rank 9 (at most 8 supported)");
}

TEST_CASE("OPTM: a learning rate that is NaN, infinite, negative or absurd is refused, naming lr") {
  for (double lr : {std::nan(""), std::numeric_limits<double>::infinity(), -0.1, 1e300}) {
    CAPTURE(lr);
    auto const msg = decode_error(with_section("OPTM", optm_body(lr, 1)));
    CHECK(msg.find("checkpoint f.ckpt: section OPTM: lr = ") == 0);
    CHECK(contains(msg, " is not a learning rate (must be finite, >= 0 and <= 1e+06)"));
  }
}

TEST_CASE("OPTM: negative or absurd step counts are refused, naming the parameter") {
  CHECK(decode_error(with_section("OPTM", optm_body(0.1, -1))) ==
        "checkpoint f.ckpt: section OPTM: steps of optimizer state of 'w' = -1 is out of range (must be in [0, "
        "9007199254740992])");
  CHECK(contains(decode_error(with_section("OPTM", optm_body(0.1, std::int64_t{1} << 60))),
                 "steps of optimizer state of 'w' = 1152921504606846976 is out of range"));
}

TEST_CASE("OPTM: more state buffers per parameter than any optimizer keeps is refused") {
  CHECK(decode_error(with_section("OPTM", optm_body(0.1, 1, 1000))) ==
        "checkpoint f.ckpt: section OPTM: 1000 state buffers per parameter (at most 16 accepted)");
}

TEST_CASE("META: negative or absurd counters, a huge world size, duplicate keys and a missing key are refused") {
  auto meta = valid_meta();
  meta[0].second = -1;
  CHECK(decode_error(with_section("META", meta_body(meta))) ==
        "checkpoint f.ckpt: section META: 'epoch' = -1 is out of range (must be in [0, 9007199254740992])");
  meta = valid_meta();
  meta[2].second = std::numeric_limits<std::int64_t>::max();
  CHECK(contains(decode_error(with_section("META", meta_body(meta))), "'global_step' = 9223372036854775807"));
  meta = valid_meta();
  meta[4].second = std::int64_t{1} << 40;
  CHECK(contains(decode_error(with_section("META", meta_body(meta))),
                 "section META: 'world_size' = 1099511627776 is out of range (must be in [0, 1048576])"));
  meta = valid_meta();
  meta.push_back({"step", 1});
  CHECK(decode_error(with_section("META", meta_body(meta))) ==
        "checkpoint f.ckpt: section META: entry 'step' appears twice");
  meta = valid_meta();
  meta.pop_back();
  CHECK(decode_error(with_section("META", meta_body(meta))) == "checkpoint f.ckpt: META has no 'element_bytes' entry");
  detail::ByteWriter huge;
  huge.put(std::uint32_t{0x7FFFFFFF});
  CHECK(decode_error(with_section("META", huge.bytes())) ==
        "checkpoint f.ckpt: section META: entry count: 2147483647 × 12 bytes announced, but only 0 bytes remain");
}

TEST_CASE("RNGS: 2^32 - 1 ranks of no generators (100 GB of empty lists) and a bad spare flag are refused") {
  detail::ByteWriter s;
  s.put(std::uint32_t{0});
  s.put(std::uint32_t{0xFFFFFFFF});
  CHECK(decode_error(with_section("RNGS", s.bytes())) ==
        "checkpoint f.ckpt: section RNGS: the number of ranks = 4294967295 is out of range (must be in [0, 1048576])");
  detail::ByteWriter g;
  g.put(std::uint32_t{1});
  g.put_string("gen");
  g.put(std::uint32_t{1});
  g.put(std::uint64_t{1});
  g.put(std::uint64_t{3});
  g.put(0.5);
  g.put(std::uint64_t{7});
  CHECK(decode_error(with_section("RNGS", g.bytes())) ==
        "checkpoint f.ckpt: section RNGS: generator 'gen' has a bad spare normal value (has_spare = 7, spare = 0.5)");
}

TEST_CASE("the section table: a non-zero reserved word, a duplicate section and a missing one are refused") {
  auto secs = split(encode_checkpoint(valid_data()));
  secs[1].reserved = 9;
  CHECK(decode_error(assemble(secs)) == "checkpoint f.ckpt: section PARM has 9 in its reserved field (must be 0)");
  secs = split(encode_checkpoint(valid_data()));
  secs.push_back(secs[1]);
  CHECK(decode_error(assemble(secs)) == "checkpoint f.ckpt: section PARM appears twice");
  secs = split(encode_checkpoint(valid_data()));
  secs.erase(secs.begin() + 3);
  CHECK(decode_error(assemble(secs)) == "checkpoint f.ckpt: required section OPTM is missing");
  // A header announcing 2^32 - 1 sections over a short payload (checksums correct).
  auto bytes = encode_checkpoint(valid_data());
  std::uint32_t const many = 0xFFFFFFFF;
  std::memcpy(bytes.data() + 12, &many, 4);
  std::uint32_t const crc = detail::crc32_of(bytes.data(), kCheckpointHeaderBytes - 4);
  std::memcpy(bytes.data() + kCheckpointHeaderBytes - 4, &crc, 4);
  CHECK(contains(decode_error(bytes), "checkpoint f.ckpt: section table: section count: 4294967295 × 16 bytes"));
}

TEST_CASE("/dev/zero, a FIFO and a directory are refused at once, naming the path and what it is") {
  auto const dir = test::temp_dir("checkpoint_validation", "special");
  CHECK(read_error("/dev/zero") ==
        "checkpoint /dev/zero is a character device, not a regular file: a checkpoint is a file written by "
        "save_checkpoint / write_checkpoint_file");
  auto const fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(contains(read_error(fifo), fifo.string() + " is a FIFO (named pipe), not a regular file"));  // no hang
  CHECK(contains(read_error(dir), dir.string() + " is a directory, not a regular file"));
  // --resume /dev/zero: every rank gets rank 0's error.
  std::vector<std::string> errs(2);
  std::mutex mu;
  spawn(2, [&](ThreadsBackend& comm) {
    Generator g(1);
    auto m = nn::Sequential(nn::named("fc", nn::Linear(2, 2, g)));
    nn::ParameterArena<float> arena(m);
    optim::SGD opt(arena, {.lr = 0.1});
    std::string err;
    try {
      load_checkpoint("/dev/zero", comm, m, opt);
    } catch (IoError const& e) {
      err = e.what();
    }
    std::lock_guard lock(mu);
    errs[static_cast<std::size_t>(comm.rank())] = err;
  });
  for (auto const& e : errs) CHECK(contains(e, "checkpoint /dev/zero is a character device"));
}

TEST_CASE("a huge file that is not a checkpoint is refused after reading its header, not read whole") {
  auto const dir = test::temp_dir("checkpoint_validation", "huge");
  auto const p = dir / "sparse.bin";
  dump(p, "not a checkpoint, but long enough for a header");
  std::error_code ec;
  fs::resize_file(p, std::uintmax_t{64} << 30, ec);  // 64 GiB, sparse: nothing is written
  if (ec) {
    MESSAGE("skipped: this file system cannot make a 64 GiB sparse file (", ec.message(), ")");
    return;
  }
  auto const t0 = std::chrono::steady_clock::now();
  CHECK(read_error(p) == "checkpoint " + p.string() + ": wrong magic number: this is not a ddp checkpoint");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // reading 64 GiB would take minutes
  fs::remove(p);
  // A valid header whose payload length disagrees with the file's size: refused from the header alone.
  auto bytes = encode_checkpoint(valid_data());
  dump(p, bytes.substr(0, kCheckpointHeaderBytes));
  fs::resize_file(p, std::uintmax_t{64} << 30, ec);
  CHECK(contains(read_error(p), "unexpected bytes after the"));
}

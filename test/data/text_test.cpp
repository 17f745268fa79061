// Character-level text: CharVocab round trips, nanoGPT's 90/10 split, BlockBatcher's counter-based offsets.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "ddp/data/data.hpp"

using ddp::data::BlockBatcher;
using ddp::data::CharVocab;
using ddp::data::TextCorpus;

namespace {

std::filesystem::path text_tmp_dir() {
  char const* test_tmp = std::getenv("TEST_TMPDIR");
  auto dir = (test_tmp ? std::filesystem::path(test_tmp) : std::filesystem::temp_directory_path()) / "ddp_text_test";
  std::filesystem::create_directories(dir);
  return dir;
}

std::filesystem::path write_text_file(std::string const& name, std::string const& content) {
  auto const path = text_tmp_dir() / name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string what_of(auto&& fn) {
  try {
    fn();
  } catch (ddp::Error const& e) {
    return e.what();
  }
  return "(no exception)";
}

std::vector<std::int32_t> text_iota(std::int64_t n) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

}  // namespace

TEST_CASE("CharVocab is the sorted set of distinct bytes and encode/decode round trip") {
  std::string const text = "hello world\nHELLO!";
  CharVocab const vocab(text);
  CHECK(vocab.chars() == std::string("\n !EHLOdehlorw"));
  CHECK(vocab.size() == 14);
  auto const ids = vocab.encode(text);
  REQUIRE(ids.size() == text.size());
  CHECK(ids[0] == 9);   // 'h'
  CHECK(ids[11] == 0);  // '\n'
  CHECK(vocab.decode(ids) == text);
  CHECK(vocab.encode("").empty());
  CHECK(CharVocab(std::string("\xff\x00z", 3)).chars() == std::string("\x00z\xff", 3));
}

TEST_CASE("CharVocab's errors name the unknown character and its position, or the bad id") {
  CharVocab const vocab("abc");
  auto const msg = what_of([&] { vocab.encode("abxc"); });
  CHECK(msg.find("'x' (0x78)") != std::string::npos);
  CHECK(msg.find("position 2") != std::string::npos);
  CHECK_THROWS_AS(vocab.encode("a\n"), ddp::ArgumentError);
  CHECK(what_of([&] { vocab.encode("a\n"); }).find("'\\n'") != std::string::npos);
  std::vector<std::int32_t> const bad{0, 1, 3};
  auto const dmsg = what_of([&] { vocab.decode(bad); });
  CHECK(dmsg.find("id 3 at position 2") != std::string::npos);
  CHECK(dmsg.find("[0, 3)") != std::string::npos);
  std::vector<std::int32_t> const negative{-1};
  CHECK_THROWS_AS(vocab.decode(negative), ddp::ArgumentError);
}

TEST_CASE("TextCorpus splits as nanoGPT: train = data[:int(n*0.9)], val = the rest") {
  for (std::int64_t n : {10, 11, 19, 1000, 1001, 1115394}) {
    CAPTURE(n);
    std::string text(static_cast<std::size_t>(n), 'a');
    for (std::int64_t i = 0; i < n; ++i) text[static_cast<std::size_t>(i)] = static_cast<char>('a' + i % 7);
    auto const c = TextCorpus::from_text(text);
    auto const expected_train = static_cast<std::int64_t>(static_cast<double>(n) * 0.9);
    CHECK(static_cast<std::int64_t>(c.train().size()) == expected_train);
    CHECK(static_cast<std::int64_t>(c.val().size()) == n - expected_train);
    CHECK(c.train().data() + c.train().size() == c.val().data());
    CHECK(c.vocab().size() == 7);
  }
  CHECK(TextCorpus::from_text(std::string(1000, 'q')).train().size() == 900);
  CHECK(TextCorpus::from_text(std::string(1115394, 'q')).val().size() == 111540);  // nanoGPT's val tokens
  CHECK(TextCorpus::from_text(std::string(100, 'q'), {.val_fraction = 0.25}).val().size() == 25);
}

TEST_CASE("TextCorpus::load reads the vendored tinyshakespeare as nanoGPT's shakespeare_char prepare.py does") {
  std::filesystem::path const path = "third_party/tinyshakespeare/input.txt";
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string(),
                  " not found: run from the workspace root or bazel test");
  auto const c = TextCorpus::load(path, {.block_size = 64});
  CHECK(c.size() == 1115394);
  CHECK(c.vocab().size() == 65);
  CHECK(c.vocab().chars() == "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  CHECK(c.train().size() == 1003854);
  CHECK(c.val().size() == 111540);
  CHECK(c.vocab().decode(c.train().first(14)) == "First Citizen:");
}

TEST_CASE("TextCorpus errors name the file: missing, a directory, empty, too short; and the bad option") {
  auto const missing = text_tmp_dir() / "no_such_corpus.txt";
  std::filesystem::remove(missing);
  auto msg = what_of([&] { TextCorpus::load(missing); });
  CHECK(msg.find(missing.string()) != std::string::npos);
  CHECK(msg.find("no such file") != std::string::npos);
  CHECK_THROWS_AS(TextCorpus::load(missing), ddp::IoError);

  CHECK(what_of([&] { TextCorpus::load(text_tmp_dir()); }).find("is a directory") != std::string::npos);

  auto const empty = write_text_file("empty.txt", "");
  msg = what_of([&] { TextCorpus::load(empty); });
  CHECK(msg.find(empty.string()) != std::string::npos);
  CHECK(msg.find("empty") != std::string::npos);
  CHECK_THROWS_AS(TextCorpus::load(empty), ddp::IoError);

  auto const one = write_text_file("one.txt", "x");
  CHECK_THROWS_AS(TextCorpus::load(one), ddp::IoError);
  auto const short_file = write_text_file("short.txt", std::string(100, 'y'));  // val: 10 characters
  CHECK(TextCorpus::load(short_file, {.block_size = 9}).val().size() == 10);
  msg = what_of([&] { TextCorpus::load(short_file, {.block_size = 10}); });
  CHECK(msg.find(short_file.string()) != std::string::npos);
  CHECK(msg.find("90 train and 10 validation") != std::string::npos);
  CHECK(msg.find("block_size 10") != std::string::npos);

  CHECK(what_of([] { TextCorpus::from_text("abc", {.val_fraction = 1.0}); }).find("val_fraction") != std::string::npos);
  CHECK_THROWS_AS(TextCorpus::from_text("abc", {.val_fraction = 0.0}), ddp::ArgumentError);
}

TEST_CASE("BlockBatcher offsets depend only on (seed, step, index), in any call order, within [0, n - T)") {
  auto const tokens = text_iota(1000);
  BlockBatcher const a(tokens, {.block_size = 16, .seed = 1337});
  BlockBatcher const b(tokens, {.block_size = 16, .seed = 1337});
  CHECK(a.num_offsets() == 984);
  auto const a5 = a.offsets(5, 12);
  auto const a0 = a.offsets(0, 12);
  // Another batcher, other order, and a rank's share drawn on its own: the same values.
  CHECK(b.offsets(0, 12) == a0);
  CHECK(b.offsets(5, 12) == a5);
  for (std::int64_t i = 6; i < 12; ++i) CHECK(b.offset(5, i) == a5[static_cast<std::size_t>(i)]);
  // A longer batch extends the shorter one (world sizes that split a larger global batch agree on the prefix).
  auto const a5_long = a.offsets(5, 24);
  CHECK(std::vector<std::int64_t>(a5_long.begin(), a5_long.begin() + 12) == a5);
  CHECK(a0 != a5);
  CHECK(BlockBatcher(tokens, {.block_size = 16, .seed = 1338}).offsets(0, 12) != a0);
  for (std::uint64_t step = 0; step < 50; ++step)
    for (auto o : a.offsets(step, 12)) {
      CHECK(o >= 0);
      CHECK(o < 984);
    }
}

TEST_CASE("BlockBatcher offsets hit every start position (no gaps, roughly uniform)") {
  auto const tokens = text_iota(100);
  BlockBatcher const batcher(tokens, {.block_size = 8, .seed = 7});
  std::vector<int> hits(static_cast<std::size_t>(batcher.num_offsets()), 0);
  constexpr std::int64_t kSteps = 100, kBatch = 64;  // 6400 draws over 92 offsets, ~70 each
  for (std::uint64_t step = 0; step < kSteps; ++step)
    for (auto o : batcher.offsets(step, kBatch)) ++hits[static_cast<std::size_t>(o)];
  for (std::size_t o = 0; o < hits.size(); ++o) {
    CAPTURE(o);
    CHECK(hits[o] > 30);
    CHECK(hits[o] < 120);
  }
  // The offset range of one: n = T + 1 leaves only offset 0.
  auto const two = text_iota(9);
  CHECK(BlockBatcher(two, {.block_size = 8, .seed = 1}).offsets(3, 4) == std::vector<std::int64_t>(4, 0));
}

TEST_CASE("BlockBatcher::batch gives x (B, T) as float ids and y shifted by one; eval_offsets tile the split") {
  std::vector<std::int32_t> tokens(50);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>((i * 7) % 13);
  BlockBatcher const batcher(tokens, {.block_size = 5, .seed = 3});
  std::vector<std::int64_t> const offs{0, 44, 17};
  auto const batch = batcher.batch(offs);
  REQUIRE(batch.x.shape() == ddp::Shape{3, 5});
  REQUIRE(batch.y.shape() == ddp::Shape{3, 5});
  CHECK(batch.size() == 3);
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t t = 0; t < 5; ++t) {
      auto const o = static_cast<std::size_t>(offs[static_cast<std::size_t>(b)] + t);
      CHECK(batch.x[b * 5 + t] == static_cast<float>(tokens[o]));
      CHECK(batch.y[b * 5 + t] == tokens[o + 1]);
    }

  std::vector<std::int64_t> const bad{3, 45};
  auto const msg = what_of([&] { batcher.batch(bad); });
  CHECK(msg.find("offset 45 at position 1") != std::string::npos);

  // n = 50, T = 5: blocks 0, 5, ..., 40 (40 + 5 + 1 <= 50); 45 would need a 51st token.
  auto const eval = batcher.eval_offsets();
  REQUIRE(eval.size() == 9);
  for (std::size_t i = 0; i < eval.size(); ++i) CHECK(eval[i] == static_cast<std::int64_t>(5 * i));
  CHECK(batcher.batch(eval).size() == 9);
  auto const exact = text_iota(51);
  CHECK(BlockBatcher(exact, {.block_size = 5}).eval_offsets().size() == 10);
}

TEST_CASE("BlockBatcher refuses a span not longer than the block, naming both sizes") {
  auto const tokens = text_iota(8);
  auto const msg = what_of([&] { BlockBatcher(tokens, {.block_size = 8, .seed = 0}); });
  CHECK(msg.find("8 tokens") != std::string::npos);
  CHECK(msg.find("block_size 8") != std::string::npos);
  CHECK_THROWS_AS(BlockBatcher(tokens, {.block_size = 8}), ddp::ShapeError);
  CHECK_THROWS_AS(BlockBatcher(tokens, {.block_size = 0}), ddp::ArgumentError);
}

TEST_CASE("counter_below is exact multiply-shift: mulhi64 agrees with known 128-bit products") {
  using ddp::data::detail::mulhi64;
  CHECK(mulhi64(~std::uint64_t{0}, ~std::uint64_t{0}) == ~std::uint64_t{0} - 1);
  CHECK(mulhi64(std::uint64_t{1} << 32, std::uint64_t{1} << 32) == 1);
  CHECK(mulhi64(0x123456789abcdef0ULL, 0x0fedcba987654321ULL) == 0x0121fa00ad77d742ULL);
  CHECK(mulhi64(12345, 67890) == 0);
  CHECK(ddp::data::detail::counter_below(1, 2, 3, 1) == 0);
}

// Replays every seed (test/fuzz/corpus) and every input a fuzzer ever crashed on (test/fuzz/regressions) through
// the fuzzers' code (fuzz_targets.hpp): each must be accepted or rejected with a ddp::Error, never crash (the
// asan config runs this under AddressSanitizer and UBSan). Checkpoints that decode are also checked against and
// restored into a model, the path load_checkpoint takes after decoding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ddp/ddp.hpp>
#include <ddp/train/checkpoint.hpp>

#include "test/fuzz/fuzz_targets.hpp"

namespace fs = std::filesystem;

namespace {

// The files under test/fuzz/<kind>/<target> (README and dot files excluded), sorted.
std::vector<fs::path> inputs(std::string const& kind, std::string const& target) {
  std::vector<fs::path> out;
  fs::path const dir = fs::path("test/fuzz") / kind / target;
  if (!fs::is_directory(dir)) return out;
  for (auto const& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() != ".md" && !e.path().filename().string().starts_with("."))
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::uint8_t> bytes_of(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

auto small_model(std::uint64_t seed) {
  ddp::Generator g(seed);
  return ddp::nn::Sequential(ddp::nn::named("fc1", ddp::nn::Linear(4, 3, g)), ddp::nn::ReLU(),
                             ddp::nn::named("fc2", ddp::nn::Linear(3, 2, g)));
}

}  // namespace

TEST_CASE("every IDX seed and regression input is accepted or a ddp::Error, never a crash") {
  auto const seeds = inputs("corpus", "idx");
  REQUIRE(seeds.size() >= 10);  // the corpus is there (data dependency of this test)
  int accepted = 0;
  for (auto const& kind : {"corpus", "regressions"})
    for (auto const& p : inputs(kind, "idx")) {
      CAPTURE(p.string());
      auto const b = bytes_of(p);
      CHECK_NOTHROW(accepted += ddp::fuzz::idx_one(b));
      // The file path reader gives the same verdict as the in-memory one.
      bool const mem_ok = ddp::fuzz::accepts([&] { (void)ddp::decode_idx_images(b, p.string()); });
      bool const file_ok = ddp::fuzz::accepts([&] { (void)ddp::read_idx_images(p); });
      CHECK(mem_ok == file_ok);
    }
  CHECK(accepted > 0);  // the valid seeds parse
}

TEST_CASE("every checkpoint seed and regression input is accepted or a ddp::Error; decoded ones restore or fail") {
  auto const seeds = inputs("corpus", "checkpoint");
  REQUIRE(seeds.size() >= 5);
  int accepted = 0;
  for (auto const& kind : {"corpus", "regressions"})
    for (auto const& p : inputs(kind, "checkpoint")) {
      CAPTURE(p.string());
      auto const b = bytes_of(p);
      CHECK_NOTHROW(accepted += ddp::fuzz::checkpoint_one(b));
      bool const file_ok = ddp::fuzz::accepts([&] { (void)ddp::read_checkpoint_file<float>(p); });
      std::string_view const sv(reinterpret_cast<char const*>(b.data()), b.size());
      CHECK(file_ok == ddp::fuzz::accepts([&] { (void)ddp::decode_checkpoint<float>(sv, p.string()); }));
      if (!file_ok) continue;
      // Decoded: fits this model and optimizer or is an ArgumentError naming the difference; restores if it fits.
      auto const c = ddp::read_checkpoint_file<float>(p);
      auto m = small_model(5);
      ddp::nn::ParameterArena<float> arena(m);
      ddp::optim::AdamW opt(arena, {});
      CHECK_NOTHROW(ddp::fuzz::accepts([&] {
        ddp::check_checkpoint_fits(c, m, opt, p.string());
        ddp::restore_checkpoint(c, m, opt);
      }));
    }
  CHECK(accepted > 0);
}

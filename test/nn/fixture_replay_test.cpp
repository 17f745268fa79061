// Single-process training replays the PyTorch fixtures' plain runs and matches their final weights.
#include <doctest/doctest.h>

#include "tools/fixture/fixture.hpp"

using namespace ddp;

namespace {
// Trains the fixture's model for its recorded steps on one process with the recorded batches.
std::vector<float> replay_single(fixture::Fixture const& f, fixture::RunInfo const& r, std::vector<double>* losses) {
  Generator gen(0);
  auto model = f.build_model(gen);
  nn::ParameterArena<float> arena(model);
  f.load_init(arena);
  auto opt = f.make_optimizer(arena);
  auto const idx = f.batch_indices(r);
  for (std::int64_t s = 0; s < f.steps(); ++s) {
    auto ids = f.rank_batch(idx, r, 0, s);
    std::visit([](auto& o) { o.zero_grad(); }, opt);
    Var loss = f.loss(model(Var(f.batch_x(ids))), ids);
    if (losses) losses->push_back(loss.item());
    backward(loss);
    std::visit([](auto& o) { o.step(); }, opt);
  }
  return f.gather_weights(arena);
}
}  // namespace

TEST_CASE("plain single-process runs reproduce PyTorch's final weights") {
  for (char const* name : {"toy", "mlp"}) {
    CAPTURE(name);
    auto f = fixture::Fixture::load(std::string("test/fixtures/") + name);
    for (char const* run : {"plain", "ws1"}) {
      CAPTURE(run);
      auto const& r = f.run(run);
      REQUIRE(r.world_size == 1);
      std::vector<double> losses;
      auto w = replay_single(f, r, &losses);
      auto c = f.compare(w, r);
      MESSAGE((std::string(name) + "/" + run + ": max|d| = " + std::to_string(c.max_abs_diff) + " (max|w| " +
               std::to_string(c.max_abs_final) + ", max change " + std::to_string(c.max_abs_change) + ")"));
      CHECK(c.ok());
      CHECK(c.max_abs_diff <= 1e-5 * std::max(1.0, c.max_abs_final));
      // Each step's loss matches PyTorch's recorded loss too.
      REQUIRE(losses.size() == r.losses_per_rank.at(0).size());
      for (std::size_t s = 0; s < losses.size(); ++s)
        CHECK(losses[s] == doctest::Approx(r.losses_per_rank[0][s]).epsilon(1e-5));
    }
  }
}

TEST_CASE("a wrong learning rate is caught by the fixture comparison") {
  auto f = fixture::Fixture::load("test/fixtures/toy");
  auto const& r = f.run("plain");
  Generator gen(0);
  auto model = f.build_model(gen);
  nn::ParameterArena<float> arena(model);
  f.load_init(arena);
  optim::SGD opt(arena, {.lr = 0.0011});  // fixture says 0.001
  auto const idx = f.batch_indices(r);
  for (std::int64_t s = 0; s < f.steps(); ++s) {
    auto ids = f.rank_batch(idx, r, 0, s);
    opt.zero_grad();
    backward(f.loss(model(Var(f.batch_x(ids))), ids));
    opt.step();
  }
  CHECK_FALSE(f.compare(f.gather_weights(arena), r).ok());
}

TEST_CASE("fixture errors name the file") {
  CHECK_THROWS_WITH_AS(fixture::Fixture::load("test/fixtures/does-not-exist"),
                       doctest::Contains("does-not-exist/meta.json"), IoError);
}

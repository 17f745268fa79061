// The bucket plan as a pure function: reverse order, first-bucket cap, cap edge cases.
#include <doctest/doctest.h>

#include "ddp/bucket/plan.hpp"

using namespace ddp;

namespace {
std::vector<std::vector<std::size_t>> groups(BucketPlan const& p) {
  std::vector<std::vector<std::size_t>> g;
  for (auto const& b : p.buckets) g.push_back(b.params);
  return g;
}
}  // namespace

TEST_CASE("reverse registration order, closing a bucket once it reaches the cap") {
  // sizes in floats: 100 B, 200 B, 400 B, 40 B
  std::vector<std::int64_t> n{25, 50, 100, 10};
  auto p = assign_buckets(n, 4, {.cap_bytes = 300, .first_cap_bytes = 100});
  // first bucket (cap 100 B): param 3 (40 B) + param 2 (400 B) -> 440 >= 100 closes
  // next (cap 300): param 1 (200) + param 0 (100) = 300 >= 300 closes
  CHECK((groups(p) == std::vector<std::vector<std::size_t>>{{3, 2}, {1, 0}}));
  CHECK(p.buckets[0].numel == 110);
  REQUIRE(p.bucket_of.size() == 4);
  CHECK(p.bucket_of[0] == 1);
  CHECK(p.bucket_of[1] == 1);
  CHECK(p.bucket_of[2] == 0);
  CHECK(p.bucket_of[3] == 0);
}

TEST_CASE("a parameter larger than the cap closes its bucket at once (PyTorch's rule: add, then close)") {
  std::vector<std::int64_t> n{10, 1000, 10};
  // It joins whatever is open (param 2, 40 B < cap) and closes it; the next parameter starts a new bucket.
  auto p = assign_buckets(n, 4, {.cap_bytes = 100, .first_cap_bytes = 100});
  CHECK((groups(p) == std::vector<std::vector<std::size_t>>{{2, 1}, {0}}));
  // With an empty bucket open it sits alone.
  auto q = assign_buckets(n, 4, {.cap_bytes = 100, .first_cap_bytes = 8});
  CHECK((groups(q) == std::vector<std::vector<std::size_t>>{{2}, {1}, {0}}));
  CHECK(q.buckets[1].numel == 1000);
}

TEST_CASE("cap 0 gives one bucket per parameter; PerParameter and SingleBucket policies") {
  std::vector<std::int64_t> n{3, 4, 5, 6};
  auto p = assign_buckets(n, 4, {.cap_bytes = 0, .first_cap_bytes = 0});
  CHECK((groups(p) == std::vector<std::vector<std::size_t>>{{3}, {2}, {1}, {0}}));
  CHECK((groups(PerParameter{}.plan(n, 4)) == groups(p)));
  CHECK((groups(SingleBucket{}.plan(n, 4)) == std::vector<std::vector<std::size_t>>{{3, 2, 1, 0}}));
  CHECK(SingleBucket{}.plan(n, 4).buckets[0].numel == 18);
}

TEST_CASE("PyTorch's defaults: 1 MiB first bucket, then 25 MiB") {
  // 3 parameters of 2 MiB (floats) then many small: first bucket closes after the first big one.
  std::vector<std::int64_t> n{1 << 19, 1 << 19, 1 << 19, 100, 100};
  auto p = SizeCapped{}.plan(n, 4);
  CHECK((groups(p) == std::vector<std::vector<std::size_t>>{{4, 3, 2}, {1, 0}}));
  CHECK(SizeCapped{}.name().find("26214400") != std::string::npos);
}

TEST_CASE("edge cases: no parameters, zero-size parameters, bad input") {
  CHECK(assign_buckets(std::vector<std::int64_t>{}, 4).buckets.empty());
  auto p = assign_buckets(std::vector<std::int64_t>{0, 0}, 4, {.cap_bytes = 0, .first_cap_bytes = 0});
  CHECK(p.buckets.size() == 2);
  CHECK_THROWS_AS(assign_buckets(std::vector<std::int64_t>{-1}, 4), ArgumentError);
  CHECK_THROWS_AS(assign_buckets(std::vector<std::int64_t>{1}, 0), ArgumentError);
}

// BucketReducer on the threads backend: a shadowing rank (Participation::kShadow, for ddp::join) issues the
// active ranks' collectives exactly and adds nothing to the result or the flags; non-finite flags name ranks.
#include <doctest/doctest.h>

#include <cmath>

#include "ddp/comm/recording.hpp"
#include "ddp/ddp.hpp"

using namespace ddp;

namespace {
struct Layout {
  BucketPlan plan;
  std::vector<std::int64_t> offsets;
  std::int64_t total = 0;
};
// Buckets one after another, each followed by its status words.
Layout layout(int world) {
  Layout l;
  l.plan = assign_buckets(std::vector<std::int64_t>{6, 4, 3, 5}, sizeof(float), {.cap_bytes = 0, .first_cap_bytes = 0});
  for (auto const& b : l.plan.buckets) {
    l.offsets.push_back(l.total);
    l.total += b.numel + BucketReducer<float, HostSpace, ThreadsBackend>::status_slots(b.params.size(), world);
  }
  return l;
}
}  // namespace

TEST_CASE("a shadow round issues the active ranks' all-reduces and leaves their sum; non-finite flags name ranks") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    std::vector<std::vector<CollectiveRecord>> recs(n);
    spawn(n, [&](ThreadsBackend& inner) {
      Recording<ThreadsBackend> comm(inner);
      int const r = comm.rank();
      Layout const l = layout(n);
      REQUIRE(l.plan.buckets.size() >= 3);
      Tensor<float> grads(Shape{l.total});
      BucketReducer<float, HostSpace, Recording<ThreadsBackend>> red(comm, l.plan, l.offsets, grads,
                                                                     {.non_finite = NonFinite::kRaise});
      bool const active = r % 2 == 0;  // ranks 0 (and 2) active, 1 (and 3) joined
      int const actives = (n + 1) / 2;
      for (int round = 0; round < 2; ++round) {
        ReduceOutcome out;
        if (active) {
          red.begin();
          for (std::size_t b = 0; b < l.plan.buckets.size(); ++b)
            for (std::int64_t j = 0; j < l.plan.buckets[b].numel; ++j) grads[l.offsets[b] + j] = float(n);
          if (round == 1 && r == 0) grads[l.offsets[1]] = std::nanf("");
          for (std::size_t i = 0; i < l.plan.bucket_of.size(); ++i) red.mark_ready(i, i != 1);
          out = red.finish();
        } else {
          out = red.shadow_round();
        }
        for (std::size_t b = 0; b < l.plan.buckets.size(); ++b)
          for (std::int64_t j = 0; j < l.plan.buckets[b].numel; ++j) {
            float const v = grads[l.offsets[b] + j];
            if (round == 1 && b == 1 && j == 0)
              CHECK(std::isnan(v));
            else
              CHECK(v == float(actives));  // sum of the active ranks' n's, divided by n
          }
        for (std::size_t i = 0; i < l.plan.bucket_of.size(); ++i) {
          CHECK(out.missing_somewhere[i] == (i == 1 ? 1 : 0));  // the active ranks' miss only
          CHECK(out.present_somewhere[i] == (i == 1 ? 0 : 1));
        }
        CHECK(out.non_finite_ranks == (round == 1 ? std::vector<int>{0} : std::vector<int>{}));
      }
      recs[r] = comm.records();
    });
    for (int r = 1; r < n; ++r) {
      REQUIRE(recs[r].size() == recs[0].size());
      for (std::size_t i = 0; i < recs[0].size(); ++i) {
        CHECK(recs[r][i].op == recs[0][i].op);
        CHECK(recs[r][i].count == recs[0][i].count);
        CHECK(recs[r][i].tag.id == recs[0][i].tag.id);
      }
    }
    CHECK(recs[0].size() == 2 * layout(n).plan.buckets.size());
  }
}

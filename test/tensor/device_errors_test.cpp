// Device errors (include/ddp/tensor/device_errors.hpp) on Thrust's CPU system: a class id out of range in a
// device loss is not read back at the loss (no synchronisation per step) but reported at the next host read, as
// the same ArgumentError host tensors raise at once, and the device stays usable afterwards.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/ddp.hpp"
#include "ddp/tensor/device.hpp"

namespace device_errors_test {

using namespace ddp;
using Dev = DeviceSpace;

template <MemorySpace S>
Tensor<std::int32_t, S> ids(std::vector<std::int32_t> const& v) {
  Tensor<std::int32_t> t(Shape{static_cast<std::int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t[static_cast<std::int64_t>(i)] = v[i];
  return to_space<S>(t);
}

template <MemorySpace S>
Variable<float, S> logits(std::int64_t rows, std::int64_t cols) {
  Tensor<float> t(Shape{rows, cols});
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = static_cast<float>(i % 7) * 0.25f;
  return Variable<float, S>(to_space<S>(t), RequiresGrad::kYes);
}

inline bool contains(std::string const& s, std::string const& part) { return s.find(part) != std::string::npos; }

}  // namespace device_errors_test

TEST_CASE("device errors: a bad class id in cross_entropy is reported at the next host read, naming row and value") {
  using namespace device_errors_test;
  auto x = logits<Dev>(4, 10);
  auto const before = device_counts();
  auto loss = cross_entropy(x, ids<Dev>({1, 2, 12, 3}));  // no throw here: nothing was read back
  CHECK((device_counts() - before).sync_copies == 1);     // the ids' upload only
  try {
    (void)loss.item();
    FAIL("no error at the host read");
  } catch (ArgumentError const& e) {
    std::string const what = e.what();
    CAPTURE(what);
    CHECK(contains(what, "cross_entropy: target 12 at row 2 is not a class id in [0, 10)"));
    CHECK(contains(what, "reported at the next host read"));
  }
  // Reported once, then cleared: the next step is a normal one.
  auto good = cross_entropy(x, ids<Dev>({1, 2, 3, 4}));
  float const v = good.item();
  CHECK(std::isfinite(v));
  CHECK(v == doctest::Approx(cross_entropy(logits<HostSpace>(4, 10), ids<HostSpace>({1, 2, 3, 4})).item()));
  check_device_errors();  // nothing pending
}

TEST_CASE("device errors: a negative id in nll_loss fails at its own reduction; host tensors fail at once") {
  using namespace device_errors_test;
  auto x = logits<Dev>(3, 5);
  CHECK_THROWS_WITH_AS(nll_loss(log_softmax(x), ids<Dev>({0, -1, 2})),
                       doctest::Contains("nll_loss: target -1 at row 1 is not a class id in [0, 5)"), ArgumentError);
  CHECK_THROWS_WITH_AS(cross_entropy(logits<HostSpace>(3, 5), ids<HostSpace>({0, 5, 2})),
                       doctest::Contains("cross_entropy: target 5 at row 1 is not a class id in [0, 5)"),
                       ArgumentError);
  check_device_errors();
}

TEST_CASE(
    "device errors: check_ids reports the first rank slot that does not hold the bucket's id, at the next "
    "host read") {
  using namespace device_errors_test;
  using K = Kernels<Dev>;
  // Averaged rank slots of bucket 3 (id 4) on 4 ranks: each holds id / 4, which ×4 recovers.
  auto slots = [](std::vector<float> const& v) {
    Tensor<float> t(Shape{4});
    for (std::int64_t i = 0; i < 4; ++i) t[i] = v[static_cast<std::size_t>(i)];
    return to_space<Dev>(t);
  };
  auto const good = slots({1.0f, 1.0f, 1.0f, 1.0f});
  K::check_ids(4, good.data(), 4.0f, 4, 3);
  CHECK_NOTHROW(check_device_errors());

  struct Case {
    std::vector<float> words;
    std::string says;
  };
  Case const cases[] = {
      {{1.0f, 1.0f, 0.5f, 1.0f}, "bucket 3 was reduced together with another collective: rank 2 sent bucket 1"},
      {{1.0f, 0.0f, 1.0f, 1.0f}, "rank 1 sent no bucket id"},
      {{1.0f, 1.0f, 1.0f, 0.37f}, "rank 3 sent not a bucket"},
  };
  for (auto const& c : cases) {
    CAPTURE(c.says);
    auto const w = slots(c.words);
    K::check_ids(4, w.data(), 4.0f, 4, 3);  // nothing waits here
    std::string what;
    try {
      check_device_errors();
    } catch (DdpError const& e) {
      what = e.what();
    }
    CHECK(contains(what, c.says));
    CHECK(contains(what, "reported at the next host read"));
    CHECK_NOTHROW(check_device_errors());  // reported once
  }
}

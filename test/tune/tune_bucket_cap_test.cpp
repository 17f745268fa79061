// tune_bucket_cap on the threads backend (the cases: tune_bucket_cap_cases.hpp; under mpirun:
// tune_bucket_cap_mpi_main.cpp).
#include <doctest/doctest.h>

#include <algorithm>

#include "test/tune/tune_bucket_cap_cases.hpp"

using namespace ddp;

TEST_CASE("tune_bucket_cap: one cap on every rank, the model untouched, the tuned run bitwise the untuned one") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    std::vector<test::TuneOutcome> out(static_cast<std::size_t>(n));
    spawn(n, [&](ThreadsBackend& comm) { out[static_cast<std::size_t>(comm.rank())] = test::tune_case(comm); });
    auto const caps = default_candidate_caps();
    for (auto const& o : out) {
      CHECK(o.cap == out[0].cap);
      CHECK(std::find(caps.begin(), caps.end(), o.cap) != caps.end());
      CHECK(o.tried == caps.size());
      CHECK(o.ready == 6);  // conv weight and bias, batch norm weight and bias, linear weight and bias
      CHECK(o.model_unchanged);
      CHECK(o.buffers_moved_in_training);
      CHECK(o.user_hook_calls_during == 4 + 3 + 2);  // warm-up and timed steps, then the other tunings'
      CHECK(o.user_hook_calls_after == 3);           // the user's hook is back on the parameter
      CHECK(o.same_as_untuned);
      // Between the steps: the calibration's sizes up to the first that holds the 972 B of gradients, two at
      // least; every rank the same (slowest rank's) times, and they are in the model the cap was chosen with.
      CHECK(o.probe_bytes == std::vector<std::size_t>{1024, 16384});
      CHECK(o.probe_seconds == out[0].probe_seconds);
      for (double t : o.probe_seconds) CHECK(t > 0);
      CHECK(o.model_holds_probe);
      CHECK(o.start_up_as_calibrated);
      // kAuto: the start-up calibration alone where a node has more ranks than CPUs (every rank of the threads
      // backend shares one node), the probe between the steps otherwise.
      CHECK(o.auto_one_cpu == (n > 1 ? CalibrationTiming::kStartUp : CalibrationTiming::kBetweenSteps));
      CHECK(o.auto_many_cpus == CalibrationTiming::kBetweenSteps);
      CHECK(o.auto_probes_as_resolved);
    }
  }
}

TEST_CASE("tune_bucket_cap: bad options name themselves") {
  spawn(1, [](ThreadsBackend& comm) {
    auto net = test::make_tune_net();
    auto const d = test::tune_data(0);
    auto const loss = [&](auto& ddp) { return mse_loss(ddp(Var(d.x)), d.y); };
    CHECK_THROWS_WITH_AS(tune_bucket_cap(net, comm, loss, {.steps = 0}),
                         doctest::Contains("steps >= 1, got warmup 2 and steps 0"), ArgumentError);
    CHECK_THROWS_WITH_AS(tune_bucket_cap(net, comm, loss, {.caps = {}}), doctest::Contains("no candidate caps"),
                         ArgumentError);
    CHECK_THROWS_WITH_AS(tune_bucket_cap(net, comm, loss, {.node_cpus = -2}),
                         doctest::Contains("node_cpus must be >= 0 (0: this node's online CPUs), got -2"),
                         ArgumentError);
  });
}

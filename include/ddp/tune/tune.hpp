// The tuning layer: measuring a backend (probes, the calibration cache), the cost model of a DDP step built on
// those measurements, and tune_bucket_cap, which chooses a bucket cap with it. Outside <ddp/ddp.hpp>, like
// bench/ outside include/: a training loop compiles without it. Bazel: //:ddp_tune; CMake: ddp::ddp.
#pragma once

#include "ddp/tune/alpha_beta.hpp"
#include "ddp/tune/calibration.hpp"
#include "ddp/tune/cost_model.hpp"
#include "ddp/tune/probe.hpp"
#include "ddp/tune/tune_bucket_cap.hpp"

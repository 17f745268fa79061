// MetricsLog: per-epoch training metrics, kept in order and written as CSV (and read back, for a resumed run).
// train/svg_plot.hpp plots them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"

namespace ddp {

// One epoch's results, over all ranks. Epochs are numbered from 1 (as printed).
struct EpochMetrics {
  std::int64_t epoch = 0;
  double train_loss = 0;     // mean per-sample training loss over the epoch, all ranks
  double test_loss = 0;      // mean per-sample test loss
  double test_accuracy = 0;  // correct / total in [0, 1]
  std::int64_t test_correct = 0;
  std::int64_t test_total = 0;
  double seconds = 0;        // wall time of the epoch's training steps (evaluation excluded)
  std::int64_t steps = 0;    // optimizer steps in the epoch
  std::int64_t samples = 0;  // training samples over all ranks
  double lr = 0;             // learning rate used in the epoch
  friend bool operator==(EpochMetrics const&, EpochMetrics const&) = default;
};

namespace detail {

inline std::string fmt(char const* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

inline void write_text_file(std::filesystem::path const& path, std::string const& text, std::string_view what) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw IoError(ddp::detail::cat("cannot write ", what, " file ", path.string()));
  f << text;
  f.flush();
  if (!f) throw IoError(ddp::detail::cat("error writing ", what, " file ", path.string()));
}

}  // namespace detail

// Appends epochs in order; renders them as CSV. Not thread-safe; rank 0 keeps one.
class MetricsLog {
 public:
  static constexpr std::string_view kCsvHeader =
      "epoch,train_loss,test_loss,test_accuracy,test_correct,test_total,seconds,steps,samples,samples_per_second,lr";

  void add(EpochMetrics const& m) { epochs_.push_back(m); }
  std::vector<EpochMetrics> const& epochs() const noexcept { return epochs_; }
  bool empty() const noexcept { return epochs_.empty(); }

  // One header line, then one line per epoch; numbers with enough digits to compare runs.
  std::string csv() const {
    std::ostringstream os;
    os << kCsvHeader << "\n";
    for (auto const& m : epochs_) {
      os << m.epoch << "," << detail::fmt("%.6f", m.train_loss) << "," << detail::fmt("%.6f", m.test_loss) << ","
         << detail::fmt("%.6f", m.test_accuracy) << "," << m.test_correct << "," << m.test_total << ","
         << detail::fmt("%.3f", m.seconds) << "," << m.steps << "," << m.samples << ","
         << detail::fmt("%.1f", m.seconds > 0 ? static_cast<double>(m.samples) / m.seconds : 0.0) << ","
         << detail::fmt("%.6g", m.lr) << "\n";
    }
    return os.str();
  }

  // Parses what csv() wrote (e.g. kept in a checkpoint, so a resumed run's CSV and plot cover every epoch).
  // Throws IoError naming `source` for a header or row that csv() would not have written.
  static MetricsLog from_csv(std::string_view text, std::string_view source = "metrics CSV") {
    MetricsLog log;
    std::istringstream is{std::string(text)};
    std::string line;
    if (!std::getline(is, line) || line != kCsvHeader)
      throw IoError(ddp::detail::cat(source, ": the first line is not the metrics CSV header"));
    for (int row = 2; std::getline(is, line); ++row) {
      EpochMetrics m;
      double sps = 0;
      long long epoch = 0, correct = 0, total = 0, steps = 0, samples = 0;
      int used = 0;
      if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lld,%lld,%lf,%lld,%lld,%lf,%lf%n", &epoch, &m.train_loss,
                      &m.test_loss, &m.test_accuracy, &correct, &total, &m.seconds, &steps, &samples, &sps, &m.lr,
                      &used) != 11 ||
          static_cast<std::size_t>(used) != line.size())
        throw IoError(ddp::detail::cat(source, ": line ", row, " is not a metrics row: '", line, "'"));
      m.epoch = epoch;
      m.test_correct = correct;
      m.test_total = total;
      m.steps = steps;
      m.samples = samples;
      log.add(m);
    }
    return log;
  }

  void write_csv(std::filesystem::path const& path) const { detail::write_text_file(path, csv(), "metrics CSV"); }

 private:
  std::vector<EpochMetrics> epochs_;
};

}  // namespace ddp

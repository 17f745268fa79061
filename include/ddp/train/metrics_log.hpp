// MetricsLog: per-epoch training metrics, written as CSV and as a self-contained SVG plot (loss, accuracy).
#pragma once

#include <algorithm>
#include <cmath>
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

// "Nice" tick positions covering [lo, hi]: steps of 1, 2 or 5 × 10^k, about `target` of them.
inline std::vector<double> nice_ticks(double lo, double hi, int target = 5) {
  if (!(hi > lo)) hi = lo + 1;
  double const raw = (hi - lo) / target;
  double const mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  double const first = std::floor(lo / step);
  for (int i = 0; i < 1000; ++i) {  // up to the first tick at or above hi
    double const v = (first + i) * step;
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    if (v >= hi - step * 1e-9) break;
  }
  return t;
}

inline void write_text_file(std::filesystem::path const& path, std::string const& text, std::string_view what) {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw IoError(ddp::detail::cat("cannot write ", what, " file ", path.string()));
  f << text;
  f.flush();
  if (!f) throw IoError(ddp::detail::cat("error writing ", what, " file ", path.string()));
}

}  // namespace detail

// Appends epochs in order; renders them as CSV and SVG. Not thread-safe; rank 0 keeps one.
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

  // Two panels side by side: train and test loss (left), test accuracy in % (right), against the epoch;
  // axes with ticks, axis labels, a title and a legend per panel. Plain SVG 1.1, no scripts or fonts.
  std::string svg(std::string_view title = "training metrics") const {
    constexpr int kW = 900, kH = 380, kPanelW = 400, kPanelH = 260, kTop = 60, kLeft0 = 70, kLeft1 = 570;
    std::ostringstream os;
    open_svg(os, kW, kH, title);
    std::vector<double> ep, train, test, acc;
    for (auto const& m : epochs_) {
      ep.push_back(static_cast<double>(m.epoch));
      train.push_back(m.train_loss);
      test.push_back(m.test_loss);
      acc.push_back(100.0 * m.test_accuracy);
    }
    panel(os, kLeft0, kTop, kPanelW, kPanelH, "loss", ep,
          {{"train loss", "#1f77b4", &train}, {"test loss", "#ff7f0e", &test}}, false);
    panel(os, kLeft1, kTop, kPanelW - 110, kPanelH, "test accuracy (%)", ep, {{"test accuracy", "#2ca02c", &acc}},
          true);
    os << "</svg>\n";
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

  // One panel of named curves against x (a job measured per iteration rather than per epoch, e.g. a language
  // model's train and validation loss): the same axes, ticks and legend as svg(). Each curve has xs.size() points.
  struct Curve {
    char const* name;
    char const* color;
    std::vector<double> y;
  };
  static std::string curves_svg(std::string_view title, char const* xlabel, char const* ylabel,
                                std::vector<double> const& xs, std::vector<Curve> const& curves) {
    constexpr int kW = 620, kH = 380, kPanelW = 480, kPanelH = 260, kTop = 60, kLeft = 80;
    std::ostringstream os;
    open_svg(os, kW, kH, title);
    std::vector<Series> series;
    for (auto const& c : curves) {
      if (c.y.size() != xs.size())
        throw ArgumentError(ddp::detail::cat("curves_svg: curve '", c.name, "' has ", c.y.size(), " points for ",
                                             xs.size(), " x values"));
      series.push_back({c.name, c.color, &c.y});
    }
    panel(os, kLeft, kTop, kPanelW, kPanelH, ylabel, xs, series, false, xlabel);
    os << "</svg>\n";
    return os.str();
  }

  void write_csv(std::filesystem::path const& path) const { detail::write_text_file(path, csv(), "metrics CSV"); }
  void write_svg(std::filesystem::path const& path, std::string_view title = "training metrics") const {
    detail::write_text_file(path, svg(title), "metrics SVG");
  }

 private:
  struct Series {
    char const* name;
    char const* color;
    std::vector<double> const* y;
  };

  // The document's start: the XML declaration, the <svg> element of w × h, a white background and the title.
  static void open_svg(std::ostringstream& os, int w, int h, std::string_view title) {
    os << R"(<?xml version="1.0" encoding="UTF-8"?>)"
       << "\n"
       << R"(<svg xmlns="http://www.w3.org/2000/svg" width=")" << w << R"(" height=")" << h << R"(" viewBox="0 0 )" << w
       << " " << h << R"(" font-family="sans-serif" font-size="12">)"
       << "\n"
       << R"(<rect width="100%" height="100%" fill="white"/>)"
       << "\n"
       << R"(<text x=")" << w / 2 << R"(" y="24" text-anchor="middle" font-size="16">)" << escape(title) << "</text>\n";
  }

  static std::string escape(std::string_view s) {
    std::string o;
    for (char c : s) {
      switch (c) {
        case '<':
          o += "&lt;";
          break;
        case '>':
          o += "&gt;";
          break;
        case '&':
          o += "&amp;";
          break;
        case '"':
          o += "&quot;";
          break;
        default:
          o += c;
      }
    }
    return o;
  }

  static void panel(std::ostringstream& os, int x0, int y0, int w, int h, char const* ylabel,
                    std::vector<double> const& xs, std::vector<Series> const& series, bool percent,
                    char const* xlabel = "epoch") {
    // Data ranges (with a margin), then nice ticks that define the axes.
    double xlo = xs.empty() ? 1 : xs.front(), xhi = xs.empty() ? 1 : xs.back();
    if (xhi <= xlo) {
      xlo -= 0.5;
      xhi += 0.5;
    } else {  // keep the first and last points off the frame
      double const pad = (xhi - xlo) * 0.05;
      xlo -= pad;
      xhi += pad;
    }
    double ylo = 1e300, yhi = -1e300;
    for (auto const& s : series)
      for (double v : *s.y)
        if (std::isfinite(v)) {
          ylo = std::min(ylo, v);
          yhi = std::max(yhi, v);
        }
    if (ylo > yhi) ylo = 0, yhi = 1;
    if (yhi - ylo < 1e-9) {
      double const pad = std::max(std::abs(yhi) * 0.05, percent ? 1.0 : 0.01);
      ylo -= pad;
      yhi += pad;
    }
    double const margin = (yhi - ylo) * 0.08;
    ylo = std::max(percent ? 0.0 : -1e300, ylo - margin);
    yhi = percent ? std::min(100.0, yhi + margin) : yhi + margin;
    auto const yt = detail::nice_ticks(ylo, yhi);
    ylo = std::min(ylo, yt.front());
    yhi = std::max(yhi, yt.back());
    std::vector<double> xt;
    int const span = static_cast<int>(std::ceil(xhi) - std::floor(xlo));
    int const every = std::max(1, span / 10);
    for (double v = std::ceil(xlo); v <= xhi; v += every) xt.push_back(v);
    auto px = [&](double x) { return x0 + (x - xlo) / (xhi - xlo) * w; };
    auto py = [&](double y) { return y0 + h - (y - ylo) / (yhi - ylo) * h; };

    os << "<g>\n";
    os << R"(<rect x=")" << x0 << R"(" y=")" << y0 << R"(" width=")" << w << R"(" height=")" << h
       << R"(" fill="none" stroke="#888"/>)"
       << "\n";
    for (double t : yt) {
      os << R"(<line x1=")" << x0 << R"(" x2=")" << x0 + w << R"(" y1=")" << detail::fmt("%.1f", py(t)) << R"(" y2=")"
         << detail::fmt("%.1f", py(t)) << R"(" stroke="#eee"/>)"
         << R"(<text x=")" << x0 - 6 << R"(" y=")" << detail::fmt("%.1f", py(t) + 4) << R"(" text-anchor="end">)"
         << detail::fmt(percent ? "%.4g" : "%.3g", t) << "</text>\n";
    }
    for (double t : xt)
      os << R"(<line x1=")" << detail::fmt("%.1f", px(t)) << R"(" x2=")" << detail::fmt("%.1f", px(t)) << R"(" y1=")"
         << y0 + h << R"(" y2=")" << y0 + h + 5 << R"(" stroke="#888"/>)"
         << R"(<text x=")" << detail::fmt("%.1f", px(t)) << R"(" y=")" << y0 + h + 18 << R"(" text-anchor="middle">)"
         << detail::fmt("%.0f", t) << "</text>\n";
    os << R"(<text x=")" << x0 + w / 2 << R"(" y=")" << y0 + h + 36 << R"(" text-anchor="middle">)" << xlabel
       << "</text>"
       << "\n";
    os << "<text transform=\"translate(" << x0 - 50 << "," << y0 + h / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
       << ylabel << "</text>\n";
    int ly = y0 + 14;
    for (auto const& s : series) {
      std::string pts;
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (std::isfinite((*s.y)[i]))
          pts += detail::fmt("%.1f", px(xs[i])) + "," + detail::fmt("%.1f", py((*s.y)[i])) + " ";
      if (!pts.empty()) pts.pop_back();
      os << R"(<polyline fill="none" stroke=")" << s.color << R"(" stroke-width="2" points=")" << pts << R"("/>)"
         << "\n";
      for (std::size_t i = 0; i < xs.size(); ++i)
        if (std::isfinite((*s.y)[i]))
          os << R"(<circle cx=")" << detail::fmt("%.1f", px(xs[i])) << R"(" cy=")" << detail::fmt("%.1f", py((*s.y)[i]))
             << R"(" r="3" fill=")" << s.color << R"("/>)"
             << "\n";
      // Legend entry (top right of the panel).
      os << R"(<line x1=")" << x0 + w - 120 << R"(" x2=")" << x0 + w - 100 << R"(" y1=")" << ly - 4 << R"(" y2=")"
         << ly - 4 << R"(" stroke=")" << s.color << R"(" stroke-width="2"/>)"
         << R"(<text x=")" << x0 + w - 95 << R"(" y=")" << ly << R"(">)" << s.name << "</text>\n";
      ly += 16;
    }
    os << "</g>\n";
  }

  std::vector<EpochMetrics> epochs_;
};

}  // namespace ddp

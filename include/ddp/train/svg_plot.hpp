// SvgPlot: self-contained SVG plots of a training run: MetricsLog's epochs (loss, accuracy) and named curves against
// an iteration count. Plain SVG 1.1, no scripts or fonts. Kept out of the umbrella header: a job that plots includes
// it.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/error.hpp"
#include "ddp/train/metrics_log.hpp"

namespace ddp {

namespace detail {
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

}  // namespace detail

class SvgPlot {
 public:
  // Two panels side by side: train and test loss (left), test accuracy in % (right), against the epoch;
  // axes with ticks, axis labels, a title and a legend per panel. Plain SVG 1.1, no scripts or fonts.
  static std::string metrics_svg(MetricsLog const& log, std::string_view title = "training metrics") {
    constexpr int kW = 900, kH = 380, kPanelW = 400, kPanelH = 260, kTop = 60, kLeft0 = 70, kLeft1 = 570;
    std::ostringstream os;
    open_svg(os, kW, kH, title);
    std::vector<double> ep, train, test, acc;
    for (auto const& m : log.epochs()) {
      ep.push_back(static_cast<double>(m.epoch));
      train.push_back(m.train_loss);
      test.push_back(m.test_loss);
      acc.push_back(100.0 * m.test_accuracy);
    }
    panel(os, {.x0 = kLeft0, .y0 = kTop, .w = kPanelW, .h = kPanelH, .ylabel = "loss"}, ep,
          {{"train loss", "#1f77b4", &train}, {"test loss", "#ff7f0e", &test}});
    panel(os,
          {.x0 = kLeft1,
           .y0 = kTop,
           .w = kPanelW - 110,
           .h = kPanelH,
           .ylabel = "test accuracy (%)",
           .scale = Scale::kPercent},
          ep, {{"test accuracy", "#2ca02c", &acc}});
    os << "</svg>\n";
    return os.str();
  }

  // One panel of named curves against x (a job measured per iteration rather than per epoch, e.g. a language
  // model's train and validation loss): the same axes, ticks and legend as metrics_svg(). Each curve has xs.size() points.
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
    panel(os, {.x0 = kLeft, .y0 = kTop, .w = kPanelW, .h = kPanelH, .ylabel = ylabel, .xlabel = xlabel}, xs, series);
    os << "</svg>\n";
    return os.str();
  }

  static void write_metrics_svg(MetricsLog const& log, std::filesystem::path const& path,
                                std::string_view title = "training metrics") {
    detail::write_text_file(path, metrics_svg(log, title), "metrics SVG");
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

  // A panel's place (x0, y0, w, h), its axis labels and its y scale (kPercent: 0 to 100 at most).
  enum class Scale { kPlain, kPercent };
  struct Panel {
    int x0 = 0, y0 = 0, w = 0, h = 0;
    char const* ylabel = "";
    char const* xlabel = "epoch";
    Scale scale = Scale::kPlain;
  };
  static void panel(std::ostringstream& os, Panel const& p, std::vector<double> const& xs,
                    std::vector<Series> const& series) {
    int const x0 = p.x0, y0 = p.y0, w = p.w, h = p.h;
    char const *const ylabel = p.ylabel, *const xlabel = p.xlabel;
    bool const percent = p.scale == Scale::kPercent;
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
};

}  // namespace ddp

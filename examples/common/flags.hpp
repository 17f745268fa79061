// Flags: a small command-line parser for the examples: --name value or --name=value, typed values,
// defaults, --help text; unknown flags and bad values are clear errors.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ddp/error.hpp"

namespace ddp::examples {

class Flags {
 public:
  explicit Flags(std::string program, std::string summary)
      : program_(std::move(program)), summary_(std::move(summary)) {}

  Flags& add(std::string name, std::string default_value, std::string help) {
    order_.push_back(name);
    flags_[name] = {std::move(default_value), std::move(help), false};
    return *this;
  }
  // Parses argv; returns false when --help was given (usage already printed). Throws ArgumentError.
  bool parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        print_usage();
        return false;
      }
      if (a.rfind("--", 0) != 0)
        throw ArgumentError(detail::cat(program_, ": unexpected argument '", a, "' (flags start with --; see --help)"));
      std::string name = a.substr(2), value;
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else {
        auto it = flags_.find(name);
        if (it == flags_.end()) throw unknown(name);  // before looking for its value: `prog --bogus` is unknown too
        if ((it->second.value == "true" || it->second.value == "false") &&
            (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0)) {
          value = "true";  // boolean flag given alone
        } else {
          if (i + 1 >= argc) throw ArgumentError(detail::cat(program_, ": flag --", name, " needs a value"));
          value = argv[++i];
        }
      }
      auto it = flags_.find(name);
      if (it == flags_.end()) throw unknown(name);
      it->second.value = value;
      it->second.set = true;
    }
    return true;
  }

  std::string const& program() const noexcept { return program_; }
  // Every flag's value (given or default) in declaration order, but those named in `skip`: two processes with the same
  // list were given the same options, however spelt (--lr=0.1, --lr 0.1, or not at all when 0.1 is the default).
  std::vector<std::pair<std::string, std::string>> values(std::vector<std::string> const& skip = {}) const {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto const& n : order_)
      if (std::find(skip.begin(), skip.end(), n) == skip.end()) out.emplace_back(n, flags_.at(n).value);
    return out;
  }
  std::string str(std::string const& name) const { return get(name).value; }
  bool is_set(std::string const& name) const { return get(name).set; }
  std::int64_t integer(std::string const& name) const {
    std::string const& v = get(name).value;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0')
      throw ArgumentError(detail::cat(program_, ": --", name, " must be an integer, got '", v, "'"));
    if (errno == ERANGE) throw ArgumentError(detail::cat(program_, ": --", name, " is out of range: '", v, "'"));
    return x;
  }
  // An integer no smaller than `lo`.
  std::int64_t at_least(std::string const& name, std::int64_t lo) const {
    std::int64_t const v = integer(name);
    if (v < lo) throw ArgumentError(detail::cat(program_, ": --", name, " must be at least ", lo, ", got ", v));
    return v;
  }
  double real(std::string const& name) const {
    std::string const& v = get(name).value;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0')
      throw ArgumentError(detail::cat(program_, ": --", name, " must be a number, got '", v, "'"));
    if (!std::isfinite(x))
      throw ArgumentError(detail::cat(program_, ": --", name, " must be a finite number, got '", v, "'"));
    return x;
  }
  // A finite number, or nullopt for `keyword` (e.g. "off", "auto"); `what` names what is expected in the error.
  std::optional<double> number_or(std::string const& name, std::string const& keyword, std::string const& what) const {
    std::string const& v = get(name).value;
    if (v == keyword) return std::nullopt;
    char* end = nullptr;
    double const x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x))
      throw ArgumentError(detail::cat(program_, ": --", name, " must be ", what, " or ", keyword, ", got '", v, "'"));
    return x;
  }
  bool boolean(std::string const& name) const {
    std::string const& v = get(name).value;
    if (v == "true" || v == "1" || v == "yes") return true;
    if (v == "false" || v == "0" || v == "no") return false;
    throw ArgumentError(detail::cat(program_, ": --", name, " must be true or false, got '", v, "'"));
  }
  std::string choice(std::string const& name, std::vector<std::string> const& allowed) const {
    std::string const& v = get(name).value;
    for (auto const& a : allowed)
      if (a == v) return v;
    std::string list;
    for (auto const& a : allowed) list += (list.empty() ? "" : "|") + a;
    throw ArgumentError(detail::cat(program_, ": --", name, " must be one of ", list, ", got '", v, "'"));
  }
  std::string usage() const {
    std::ostringstream os;
    os << "usage: " << program_ << " [flags]\n" << summary_ << "\n\nflags:\n";
    for (auto const& n : order_) {
      auto const& f = flags_.at(n);
      os << "  --" << n << (f.value.empty() ? "" : " (default: " + f.value + ")") << "\n      " << f.help << "\n";
    }
    return os.str();
  }
  void print_usage() const { std::fputs(usage().c_str(), stdout); }

 private:
  struct Flag {
    std::string value, help;
    bool set;
  };
  ArgumentError unknown(std::string const& name) const {
    std::string valid;
    for (auto const& n : order_) valid += (valid.empty() ? "--" : ", --") + n;
    return ArgumentError(detail::cat(program_, ": unknown flag --", name, " (valid flags: ", valid, "; see --help)"));
  }
  Flag const& get(std::string const& name) const {
    auto it = flags_.find(name);
    if (it == flags_.end())
      throw ArgumentError(detail::cat(program_, ": internal: flag --", name, " was never declared"));
    return it->second;
  }
  std::string program_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Flag> flags_;
};

}  // namespace ddp::examples

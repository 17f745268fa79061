// What a process must share with an elastic job to join it (join_elastic, train/elastic_store.hpp): the same binary
// (binary_identity: ddp's version and a digest of the executable, compared always), the same model (model_identity:
// every distinct parameter's name and shape, as DDP's cross-rank check sees them), and whatever else the job adds
// (its flags). A joiner that differs is refused before it takes part in anything, and the refusal names the item:
// "this process's model is '4 tensors, 203530 values, layout 5c0e...', the job's is '8 tensors, ...'".
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "ddp/comm/rendezvous/store_membership.hpp"
#include "ddp/config.hpp"
#include "ddp/nn/module.hpp"
#include "ddp/parallel/replicas.hpp"

namespace ddp {

namespace detail {
inline void fnv1a(std::uint64_t& h, char const* p, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ULL;
  }
}
inline std::string hex64(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace detail

// ddp's version and the FNV-1a 64 digest of this process's executable (/proc/self/exe): another build of the program
// differs here.
inline IdentityItem binary_identity() {
  std::string value = detail::cat("ddp ", DDP_VERSION_MAJOR, ".", DDP_VERSION_MINOR, ".", DDP_VERSION_PATCH);
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) return {"binary", value + ", executable unreadable"};
  std::uint64_t h = 14695981039346656037ULL, size = 0;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    auto const n = static_cast<std::size_t>(in.gcount());
    detail::fnv1a(h, buf, n);
    size += n;
  }
  return {"binary", detail::cat(value, ", executable of ", size, " bytes, FNV-1a 64 ", detail::hex64(h))};
}

// The model's parameters as DDP compares them across ranks: how many distinct tensors, how many values, and a digest
// of their names, shapes and frozen flags in registration order.
template <nn::Model M>
IdentityItem model_identity(M const& model) {
  std::uint64_t h = 14695981039346656037ULL;
  std::int64_t values = 0;
  auto const sigs = detail::signatures(model);
  for (auto const& s : sigs) {
    detail::fnv1a(h, s.name.data(), s.name.size() + 1);  // (with its terminator: names stay apart)
    for (int d = 0; d < s.shape.rank(); ++d) {
      std::int64_t const dim = s.shape[d];
      detail::fnv1a(h, reinterpret_cast<char const*>(&dim), sizeof dim);
    }
    char const frozen = s.frozen ? 1 : 0;
    detail::fnv1a(h, &frozen, 1);
    values += s.shape.numel();
  }
  return {"model", detail::cat(sigs.size(), " tensors, ", values, " values, layout ", detail::hex64(h))};
}

}  // namespace ddp

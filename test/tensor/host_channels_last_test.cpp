// host_channels_last.hpp: the NCHW <-> channel-fastest transposes, on sizes that are and are not multiples of
// the 8x8 register blocks, with the mask (fused ReLU gradient), bias, accumulation and ReLU options.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ddp/tensor/host_channels_last.hpp"
#include "ddp/tensor/random.hpp"

namespace {
template <class T>
void check_case(std::int64_t nc, std::int64_t np) {
  ddp::Generator g(static_cast<std::uint64_t>(nc * 1000 + np));
  std::vector<T> planes(nc * np), mask(nc * np), bias(nc), rows(np * (nc + 3), T(-7)), back(nc * np), acc(nc * np);
  for (auto& v : planes) v = g.uniform<T>(-1, 1);
  for (auto& v : mask) v = g.uniform<T>(-1, 1);
  for (auto& v : bias) v = g.uniform<T>(-1, 1);
  for (auto& v : acc) v = g.uniform<T>(-1, 1);
  std::int64_t const ld = nc + 3;  // rows with padding between them: row(p) is any pointer
  auto row = [&](std::int64_t p) { return rows.data() + p * ld; };
  INFO("nc ", nc, " np ", np);
  ddp::detail::planes_to_rows(planes.data(), np, nc, np, row);
  bool ok = true;
  for (std::int64_t c = 0; c < nc; ++c)
    for (std::int64_t p = 0; p < np; ++p) ok &= row(p)[c] == planes[c * np + p];
  CHECK(ok);
  for (std::int64_t p = 0; p < np; ++p) ok &= row(p)[nc] == T(-7);  // the padding is untouched
  CHECK(ok);
  ddp::detail::planes_to_rows(planes.data(), np, nc, np, row, mask.data());
  for (std::int64_t c = 0; c < nc; ++c)
    for (std::int64_t p = 0; p < np; ++p) ok &= row(p)[c] == (mask[c * np + p] > T(0) ? planes[c * np + p] : T(0));
  CHECK(ok);
  ddp::detail::planes_to_rows(planes.data(), np, nc, np, row);
  auto crow = [&](std::int64_t p) -> T const* { return rows.data() + p * ld; };
  ddp::detail::rows_to_planes(crow, nc, np, bias.data(), T(0), back.data(), np);
  for (std::int64_t c = 0; c < nc; ++c)
    for (std::int64_t p = 0; p < np; ++p) ok &= back[c * np + p] == planes[c * np + p] + bias[c];
  CHECK(ok);
  std::vector<T> before = acc;
  ddp::detail::rows_to_planes(crow, nc, np, static_cast<T const*>(nullptr), T(1), acc.data(), np);
  for (std::int64_t i = 0; i < nc * np; ++i) ok &= acc[i] == before[i] + planes[i];
  CHECK(ok);
  ddp::detail::rows_to_planes(crow, nc, np, bias.data(), T(0), back.data(), np, /*relu=*/true);
  for (std::int64_t c = 0; c < nc; ++c)
    for (std::int64_t p = 0; p < np; ++p) {
      T const v = planes[c * np + p] + bias[c];
      ok &= back[c * np + p] == (v > T(0) ? v : T(0));
    }
  CHECK(ok);
}
}  // namespace

TEST_CASE("planes_to_rows / rows_to_planes: exact, in and out of whole 8x8 blocks, float and double") {
  for (std::int64_t nc : {1, 7, 8, 16, 19, 64})
    for (std::int64_t np : {1, 8, 13, 24, 676}) {
      check_case<float>(nc, np);
      check_case<double>(nc, np);
    }
}

// Host pages (include/ddp/tensor/host_pages.hpp): zero_and_release zeroes a range, hands its whole pages back to the
// kernel (private memory: MADV_DONTNEED; shared memory: MADV_REMOVE) and leaves the bytes around it alone;
// resident_bytes counts what stays in memory. Locked memory cannot be handed back: it is still zeroed.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "ddp/tensor/host_pages.hpp"

namespace host_pages_test {
// Whether bytes [lo, hi) of p are all `v`.
inline bool all_are(unsigned char const* p, std::size_t lo, std::size_t hi, unsigned char v) {
  for (std::size_t i = lo; i < hi; ++i)
    if (p[i] != v) return false;
  return true;
}
// This process's locked memory in kB (VmLck in /proc/self/status): AddressSanitizer makes mlock a no-op that
// returns 0, so a successful call alone does not say the pages are locked.
inline long locked_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
  return 0;
}
}  // namespace host_pages_test

TEST_CASE("host pages: a released range reads as zero, its whole pages leave memory, its neighbours stay") {
  using namespace ddp::detail;
  using host_pages_test::all_are;
  std::size_t const page = host_page_size(), n = 64 * page;
  SUBCASE("private memory (aligned_alloc)") {
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(page, n));
    REQUIRE(p != nullptr);
    std::memset(p, 7, n);
    CHECK(resident_bytes(p, n) == n);
    std::size_t const lo = 100, hi = n - 100;  // 62 whole pages inside, partial pages at both ends
    CHECK(zero_and_release(p + lo, hi - lo) == 62 * page);
    CHECK(resident_bytes(p, n) == 2 * page);  // the two end pages, still holding 7s (counted before reading the
    CHECK(all_are(p, lo, hi, 0));             // others: a read maps the kernel's zero page, which mincore counts)
    CHECK(all_are(p, 0, lo, 7));
    CHECK(all_are(p, hi, n, 7));
    std::memset(p, 9, n);  // written again: back in memory
    CHECK(resident_bytes(p, n) == n);
    std::free(p);
  }
  SUBCASE("shared memory (an MPI shared-memory window is one)") {
    void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* p = static_cast<unsigned char*>(m);
    std::memset(p, 7, n);
    CHECK(zero_and_release(p + page, 10 * page) == 10 * page);
    CHECK(resident_bytes(p, n) == n - 10 * page);
    CHECK(all_are(p, page, 11 * page, 0));
    CHECK(all_are(p, 0, page, 7));
    CHECK(all_are(p, 11 * page, n, 7));
    ::munmap(m, n);
  }
  SUBCASE("less than a page: zeroed, nothing handed back") {
    unsigned char buf[64];
    std::memset(buf, 7, sizeof buf);
    CHECK(zero_and_release(buf + 8, 16) == 0);
    CHECK(all_are(buf, 8, 24, 0));
    CHECK(all_are(buf, 0, 8, 7));
    CHECK(all_are(buf, 24, 64, 7));
    CHECK(zero_and_release(buf, 0) == 0);
  }
  SUBCASE("locked memory: zeroed, kept") {
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(page, n));
    REQUIRE(p != nullptr);
    // RLIMIT_MEMLOCK may not allow it for this user, and a sanitizer may ignore it: nothing to check then.
    if (::mlock(p, n) == 0 && host_pages_test::locked_kb() * 1024 >= static_cast<long>(n)) {
      std::memset(p, 7, n);
      CHECK(zero_and_release(p, n) == 0);
      CHECK(all_are(p, 0, n, 0));
      CHECK(resident_bytes(p, n) == n);
      ::munlock(p, n);
    }
    std::free(p);
  }
}

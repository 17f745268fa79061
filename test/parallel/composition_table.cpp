// Prints kCompositionRules (parallel/composition.hpp) as the README's "What composes" table, in Markdown; the
// composition_table_test compares it with README.md.
#include <cstdio>

#include "ddp/parallel/composition.hpp"

int main() {
  std::printf("| Rule | Checked at | Refused |\n|---|---|---|\n");
  for (auto const& r : ddp::kCompositionRules)
    std::printf("| `%.*s` | %.*s | %.*s |\n", static_cast<int>(r.id.size()), r.id.data(),
                static_cast<int>(r.when.size()), r.when.data(), static_cast<int>(r.refuses.size()), r.refuses.data());
}

// libFuzzer target: manifest.json text through the manifest parser; what it
// accepts must write back and parse again to the same manifest.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nl::Result<nl::Manifest> m = nl::ManifestFromJson(text, "fuzz/manifest.json");
  if (!m.ok()) return 0;
  const std::string again = nl::ManifestToJson(*m);
  nl::Result<nl::Manifest> m2 = nl::ManifestFromJson(again, "fuzz/again.json");
  if (!m2.ok() || nl::ManifestToJson(*m2) != again) __builtin_trap();
  // Original sizes (--max-side): decoded, or refused; what decodes encodes
  // back to the same text.
  for (const auto& [name, split] : m->splits) {
    nl::Result<std::vector<std::array<uint32_t, 2>>> sizes = nl::OriginalSizes(split);
    if (sizes.ok() && split.max_side > 0 && nl::EncodeOriginalSizes(*sizes) != split.original_sizes)
      __builtin_trap();
  }
  return 0;
}

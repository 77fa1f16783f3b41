// CIFAR-100, binary version: a `cifar-100-binary/` directory (train.bin,
// test.bin, fine_label_names.txt, coarse_label_names.txt) or the official
// `cifar-100-binary.tar.gz`, read in memory without unpacking to disk.
//
// A record is 1 byte coarse label, 1 byte fine label, then 3072 bytes of
// pixels: 1024 R, 1024 G, 1024 B, each 32x32 row-major.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "formats/pack/source.h"

namespace nl {

inline constexpr size_t kCifarRecordSize = 3074;
inline constexpr uint32_t kCifarSide = 32;

enum class CifarLabel { kFine, kCoarse };

struct CifarFiles {
  FileBytes train, test;  // the .bin files (mapped, or decompressed from the archive)
  std::vector<std::string> fine_names, coarse_names;  // one per label, in order
};

// Reads SRC (a directory or a .tar.gz / .tgz / .tar). Checks that each .bin's
// size is a multiple of 3074 (else Corruption with the byte offset of the
// incomplete record) and that the name lists have 100 and 20 entries.
Result<CifarFiles> ReadCifar100(const std::string& src);

class CifarSplitSource : public SampleSource {
 public:
  // `bin` must outlive this source. Validates every label.
  static Result<std::unique_ptr<CifarSplitSource>> Create(std::span<const uint8_t> bin,
                                                          std::string file_name,
                                                          const std::vector<std::string>* classes,
                                                          CifarLabel label);
  uint64_t size() const override { return bin_.size() / kCifarRecordSize; }
  const std::vector<std::string>& classes() const override { return *classes_; }
  std::string Describe(uint64_t i) const override;
  Status Load(uint64_t i, SourceSample* out) const override;

 private:
  std::span<const uint8_t> bin_;
  std::string file_name_;
  const std::vector<std::string>* classes_ = nullptr;
  CifarLabel label_ = CifarLabel::kFine;
};

// Writes a CIFAR-100 in the official binary format into `dir` (train.bin,
// test.bin and the two name files). Images carry class-dependent patterns a
// network can learn (colour, stripe orientation and frequency per fine
// class) plus noise; coarse label = fine / 5. Deterministic in `seed`.
// The most images --train / --test may ask for (20 x CIFAR-100's 50,000;
// the split is built in memory, 3074 bytes an image).
inline constexpr uint64_t kMaxFakeCifarImages = 1'000'000;
struct FakeCifarOptions {
  uint64_t train = 5000;
  uint64_t test = 1000;
  uint64_t seed = 0;
};
Status WriteFakeCifar100(const std::string& dir, const FakeCifarOptions& options);

}  // namespace nl

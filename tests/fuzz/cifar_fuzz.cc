// libFuzzer target: the CIFAR-100 reader, from a directory (the input is
// train.bin and, halved, test.bin) or from an archive (the input is a .tar.gz
// or a .tar), then a few records through the split source, as
// `pack_tool cifar100` reads them. The first byte picks the form.
#include <cstddef>
#include <cstdint>
#include <string>

#include "formats/pack/cifar_source.h"
#include "tests/fuzz/fuzz_fs.h"

namespace {
void WriteNames(const std::string& dir) {
  std::string fine, coarse;
  for (int i = 0; i < 100; ++i) fine += "f" + std::to_string(i) + "\n";
  for (int i = 0; i < 20; ++i) coarse += "c" + std::to_string(i) + "\n";
  nl_fuzz::WriteFile(dir + "/fine_label_names.txt", fine.data(), fine.size());
  nl_fuzz::WriteFile(dir + "/coarse_label_names.txt", coarse.data(), coarse.size());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string dir = nl_fuzz::FreshDir();
  const uint8_t form = data[0] % 3;
  ++data;
  --size;
  std::string src = dir;
  if (form == 0) {
    nl_fuzz::WriteFile(dir + "/train.bin", data, size);
    nl_fuzz::WriteFile(dir + "/test.bin", data, size / 2);
    WriteNames(dir);
  } else {
    src = dir + (form == 1 ? "/cifar-100-binary.tar.gz" : "/cifar-100-binary.tar");
    nl_fuzz::WriteFile(src, data, size);
  }
  nl::Result<nl::CifarFiles> files = nl::ReadCifar100(src);
  if (!files.ok()) return 0;
  for (nl::CifarLabel label : {nl::CifarLabel::kFine, nl::CifarLabel::kCoarse}) {
    const auto* names = label == nl::CifarLabel::kFine ? &files->fine_names : &files->coarse_names;
    auto source = nl::CifarSplitSource::Create(files->train.span(), "train.bin", names, label);
    if (!source.ok()) continue;
    nl::SourceSample s;
    const uint64_t n = (*source)->size();
    for (uint64_t i : {uint64_t{0}, n / 2, n ? n - 1 : 0}) {
      if (i < n) (void)(*source)->Load(i, &s);
    }
  }
  return 0;
}

// ImageFolder with torchvision's semantics, so that sample i of a packed
// split is `torchvision.datasets.ImageFolder(root).samples[i]`:
//  - classes: the immediate subdirectories of root (symlinks followed), sorted
//    by name; a class's label is its position;
//  - a file is a sample when its name, lower-cased, ends with one of
//    .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp;
//  - per class, directories are walked recursively following symlinks, the
//    walk's (directory, files) entries sorted by directory path, and each
//    directory's files sorted by name (Python's sorted(os.walk(...))).
// A symlink that leads back to a directory already on the walk's path is a
// loop and an error. A class with no sample is an error, as in torchvision.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "formats/pack/source.h"

namespace nl {

bool HasImageExtension(const std::string& file_name);

class ImageFolderSource : public SampleSource {
 public:
  static Result<std::unique_ptr<ImageFolderSource>> Scan(const std::string& root);

  uint64_t size() const override { return paths_.size(); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::string Describe(uint64_t i) const override { return paths_[i]; }
  // Reads the file's bytes (not decoded).
  Status Load(uint64_t i, SourceSample* out) const override;

  const std::string& path(uint64_t i) const { return paths_[i]; }
  uint32_t label(uint64_t i) const { return labels_[i]; }

 private:
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<uint32_t> labels_;
};

}  // namespace nl

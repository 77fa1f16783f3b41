// manifest.json: what a shard set holds (spec: formats/FORMAT.md).
//
//   Result<Manifest> m = LoadManifest("/data/cifar100-packed");
//   const SplitInfo* train = m->FindSplit("train");
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace nl {

inline constexpr int kManifestFormatVersion = 1;
inline constexpr char kManifestFileName[] = "manifest.json";

struct ShardInfo {
  std::string path;          // shard directory, relative to the shard set root
  uint64_t first_index = 0;  // global index of its first record
  uint64_t count = 0;        // records: [first_index, first_index + count)
  uint64_t bytes = 0;        // size of its data.mdb
  std::string checksum;      // "crc32c:xxxxxxxx" over (key, value) in key order
};

struct SkippedFile {
  std::string path;
  std::string reason;
};

struct SplitInfo {
  std::string source;  // where this split was packed from
  uint64_t num_samples = 0;
  std::string encoding;  // "raw", "png", "jpeg", or "mixed" (png and jpeg)
  // [height, width, channels] when every image has the same shape.
  std::optional<std::array<uint32_t, 3>> shape;
  std::vector<ShardInfo> shards;
  std::vector<SkippedFile> skipped;
  // Packed with --max-side: the longest side images were limited to (0: not
  // limited), and every sample's size before that, in index order, as
  // base64 of little-endian uint32 (width, height) pairs (OriginalSizes
  // decodes it; readers that do not need it never do).
  uint32_t max_side = 0;
  std::string original_sizes;
  // Packed with --jpeg-restarts: its JPEGs, kept ones too, restart at every
  // row of MCUs (their pixels are the original files').
  bool jpeg_restarts = false;
  uint64_t total_bytes() const;
};

struct Manifest {
  int format_version = kManifestFormatVersion;
  std::string source_kind;  // "cifar100" or "imagefolder"
  std::string source_path;
  std::string label_kind;            // "fine" / "coarse" (cifar100), "class_dirs" (imagefolder)
  std::vector<std::string> classes;  // in label order
  std::map<std::string, SplitInfo> splits;

  const SplitInfo* FindSplit(const std::string& name) const;
};

// A split's original sizes ({width, height} per sample, index order), from
// its `original_sizes`; empty when it was packed without --max-side.
// Corruption when the text is not base64 of 8 bytes per sample, or a side
// is 0 or over 2^20.
Result<std::vector<std::array<uint32_t, 2>>> OriginalSizes(const SplitInfo& s);
// The inverse, for the packer.
std::string EncodeOriginalSizes(const std::vector<std::array<uint32_t, 2>>& sizes);

// Strings in manifest.json (names come from the file system and need not be
// UTF-8) are escaped losslessly: each byte that is not part of valid UTF-8
// becomes the four characters \xHH (HH: two upper-case hex digits), and a
// backslash becomes two backslashes (FORMAT.md, "Names").
std::string EscapeManifestString(const std::string& raw);
// The inverse; an escape that is not one of the two forms stays as written.
std::string UnescapeManifestString(const std::string& escaped);

// Never throws: every string is escaped to valid UTF-8 first.
std::string ManifestToJson(const Manifest& m);
// Parses and checks consistency: version, shards contiguous from 0 and
// summing to num_samples, counts and sizes non-negative integers, a non-empty
// class list, shard paths relative, without NUL and without "." or ".."
// components.
Result<Manifest> ManifestFromJson(const std::string& json, const std::string& where);
Result<Manifest> LoadManifest(const std::string& root);
// Writes root/manifest.json atomically (temp file, fsync, rename).
Status SaveManifest(const std::string& root, const Manifest& m);

}  // namespace nl

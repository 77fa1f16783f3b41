// libFuzzer target: the ImageFolder scanner on a tree the input describes,
// then every sample it finds loaded, as `pack_tool imagefolder` does. Each
// input line makes one entry under the root:
//   a/b/c.png      a file (parent directories made); its content is a small
//                  valid PNG if the line ends with '!', else the line's bytes
//   @a/link>target a symbolic link (loops and links out of the tree too)
//   #a/b           a directory without read permission
// Names may hold any byte but '/' and NUL (non-UTF-8 included).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/image.h"
#include "formats/pack/imagefolder_source.h"
#include "tests/fuzz/fuzz_fs.h"

namespace {

std::vector<uint8_t> SmallPng() {
  nl::Image img;
  img.width = 2;
  img.height = 2;
  img.pixels.assign(12, 200);
  return *nl::EncodePng(img, 1);
}

// "a/b/c" cleaned: at most 4 components, none empty, "." or "..".
std::string CleanPath(const std::string& raw) {
  std::string out, part;
  int parts = 0;
  auto flush = [&] {
    if (!part.empty() && part != "." && part != ".." && parts < 4) {
      out += (out.empty() ? "" : "/") + part.substr(0, 60);
      ++parts;
    }
    part.clear();
  };
  for (char c : raw) {
    if (c == '/') {
      flush();
    } else if (c != '\0') {
      part += c;
    }
  }
  flush();
  return out;
}

void MakeParents(const std::string& root, const std::string& rel) {
  for (size_t at = rel.find('/'); at != std::string::npos; at = rel.find('/', at + 1)) {
    mkdir((root + "/" + rel.substr(0, at)).c_str(), 0700);
  }
}

}  // namespace

// True when no prefix of root/rel (with rel itself when `last`) is a symbolic link.
static bool NoLinkOnTheWay(const std::string& root, const std::string& rel, bool last) {
  struct stat st {};
  for (size_t pos = 0; pos != std::string::npos;) {
    pos = rel.find('/', pos + 1);
    if (pos == std::string::npos && !last) break;
    const std::string p = root + "/" + rel.substr(0, pos);
    if (lstat(p.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return false;
  }
  return true;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<uint8_t> png = SmallPng();
  const std::string root = nl_fuzz::FreshDir();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> locked;
  size_t start = 0;
  for (int lines = 0; start <= text.size() && lines < 32; ++lines) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    // Nothing may act through a symbolic link the input made: "@l>/" then
    // "#l" chmod'ed / itself (the fuzzer runs as root in CI).
    const std::string body = (line[0] == '@' || line[0] == '#') ? line.substr(1) : line;
    if (!NoLinkOnTheWay(root, CleanPath(body.substr(0, body.find('>'))), line[0] != '@')) continue;
    if (line[0] == '@') {
      const size_t arrow = line.find('>');
      const std::string rel = CleanPath(line.substr(1, arrow == std::string::npos ? std::string::npos : arrow - 1));
      if (rel.empty()) continue;
      MakeParents(root, rel);
      std::string target = arrow == std::string::npos ? "." : line.substr(arrow + 1);
      target.erase(std::remove(target.begin(), target.end(), '\0'), target.end());
      (void)!symlink(target.c_str(), (root + "/" + rel).c_str());
    } else if (line[0] == '#') {
      const std::string rel = CleanPath(line.substr(1));
      if (rel.empty()) continue;
      MakeParents(root, rel + "/x");
      chmod((root + "/" + rel).c_str(), 0);
      locked.push_back(root + "/" + rel);
    } else {
      const bool valid = line.back() == '!';
      const std::string rel = CleanPath(valid ? line.substr(0, line.size() - 1) : line);
      if (rel.empty()) continue;
      MakeParents(root, rel);
      if (valid) {
        nl_fuzz::WriteFile(root + "/" + rel, png.data(), png.size());
      } else {
        nl_fuzz::WriteFile(root + "/" + rel, line.data(), line.size());
      }
    }
  }
  nl::Result<std::unique_ptr<nl::ImageFolderSource>> src = nl::ImageFolderSource::Scan(root);
  if (src.ok()) {
    nl::SourceSample s;
    for (uint64_t i = 0; i < (*src)->size() && i < 64; ++i) {
      if ((*src)->Load(i, &s).ok() && !s.decoded) {
        nl::Image img;
        nl::DecodeLimits limits;
        limits.max_pixels = 1u << 22;
        (void)nl::DecodeImageInto(s.file_bytes, limits, &img);
      }
    }
  }
  for (const std::string& d : locked) chmod(d.c_str(), 0700);
  return 0;
}

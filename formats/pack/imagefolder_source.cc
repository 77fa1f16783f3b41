#include "formats/pack/imagefolder_source.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "base/fd.h"
#include "base/file_util.h"

namespace nl {
namespace {

struct DirId {
  dev_t dev;
  ino_t ino;
  bool operator==(const DirId&) const = default;
};

struct DirEntries {
  std::vector<std::string> dirs, files;
};

// Lists a directory like os.scandir + entry.is_dir(): a symlink to a
// directory counts as a directory; anything else (files, broken links) as a file.
Status ListDir(const std::string& dir, DirEntries* out) {
  const DirHandle d(::opendir(dir.c_str()));
  if (!d) return Status::FromErrno("cannot list directory " + dir, errno);
  errno = 0;
  while (dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_LNK || e->d_type == DT_UNKNOWN) {  // follow links, as is_dir() does
      struct stat st {};
      const std::string full = dir + "/" + name;
      is_dir = ::stat(full.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    }
    (is_dir ? out->dirs : out->files).push_back(name);
    errno = 0;
  }
  if (errno != 0) return Status::FromErrno("cannot list directory " + dir, errno);
  return Status::Ok();
}

Result<DirId> IdOf(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status::FromErrno("cannot stat " + dir, errno);
  return DirId{st.st_dev, st.st_ino};
}

// os.walk(top, followlinks=True), collecting (dir, files) pairs.
Status Walk(const std::string& dir, std::vector<DirId>* ancestors,
            std::vector<std::pair<std::string, std::vector<std::string>>>* out) {
  NL_ASSIGN_OR_RETURN(DirId id, IdOf(dir));
  if (std::find(ancestors->begin(), ancestors->end(), id) != ancestors->end()) {
    return Status::InvalidArgument("symlink loop: " + dir +
                                   " leads back to a directory already being walked");
  }
  DirEntries entries;
  NL_RETURN_IF_ERROR(ListDir(dir, &entries));
  ancestors->push_back(id);
  out->emplace_back(dir, std::move(entries.files));
  for (const std::string& sub : entries.dirs) {
    NL_RETURN_IF_ERROR(Walk(dir + "/" + sub, ancestors, out));
  }
  ancestors->pop_back();
  return Status::Ok();
}

}  // namespace

bool HasImageExtension(const std::string& name) {
  static const char* kExt[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                               ".pgm", ".tif",  ".tiff", ".webp"};
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* e : kExt) {
    const size_t n = std::char_traits<char>::length(e);
    if (lower.size() >= n && lower.compare(lower.size() - n, n, e) == 0) return true;
  }
  return false;
}

Result<std::unique_ptr<ImageFolderSource>> ImageFolderSource::Scan(const std::string& root_in) {
  std::string root = root_in;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  DirEntries top;
  NL_RETURN_IF_ERROR(ListDir(root, &top));
  std::sort(top.dirs.begin(), top.dirs.end());
  if (top.dirs.empty()) {
    return Status::NotFound("no class directories in " + root +
                            " (an ImageFolder has one subdirectory per class)");
  }
  std::unique_ptr<ImageFolderSource> s(new ImageFolderSource());
  s->classes_ = top.dirs;
  for (uint32_t label = 0; label < s->classes_.size(); ++label) {
    std::vector<std::pair<std::string, std::vector<std::string>>> walked;
    std::vector<DirId> ancestors;
    NL_RETURN_IF_ERROR(Walk(root + "/" + s->classes_[label], &ancestors, &walked));
    // sorted(os.walk(...)): by directory path, then files by name.
    std::sort(walked.begin(), walked.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    uint64_t found = 0;
    for (auto& [dir, files] : walked) {
      std::sort(files.begin(), files.end());
      for (const std::string& f : files) {
        if (!HasImageExtension(f)) continue;
        s->paths_.push_back(dir + "/" + f);
        s->labels_.push_back(label);
        ++found;
      }
    }
    if (found == 0) {
      return Status::NotFound("class directory " + root + "/" + s->classes_[label] +
                              " has no image files (extensions: .jpg .jpeg .png .ppm .bmp .pgm "
                              ".tif .tiff .webp)");
    }
  }
  return s;
}

Status ImageFolderSource::Load(uint64_t i, SourceSample* out) const {
  out->label = labels_[i];
  out->decoded = false;
  out->file_bytes.clear();
  return ReadFileInto(paths_[i], &out->file_bytes);
}

}  // namespace nl

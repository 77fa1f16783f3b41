#include "formats/pack/cifar_source.h"

#include <archive.h>
#include <archive_entry.h>

#include <cmath>
#include <random>
#include <sstream>

#include "base/file_util.h"

namespace nl {
namespace {

constexpr const char* kNames[] = {"train.bin", "test.bin", "fine_label_names.txt",
                                  "coarse_label_names.txt"};
// The most each member of the official archive can be: CIFAR-100 has 50,000
// train and 10,000 test records, and 100 / 20 short names. A member declaring
// more is refused before anything is allocated, and reading stops at the
// bound, so a decompression bomb costs at most this much memory.
constexpr uint64_t kMaxMemberBytes[] = {50'000 * kCifarRecordSize, 10'000 * kCifarRecordSize,
                                        64 << 10, 64 << 10};

std::string BaseName(const std::string& p) {
  auto pos = p.find_last_of('/');
  return pos == std::string::npos ? p : p.substr(pos + 1);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> ParseNames(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> names;
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};

// libarchive may have no words for a failure (a gzip stream cut inside its
// header gives a null error string) and an entry may have no name: both are
// null pointers, never to be appended to a std::string as they are.
std::string ErrorText(archive* a) {
  const char* s = archive_error_string(a);
  return s ? s : "unreadable (libarchive gave no reason)";
}

std::string EntryName(archive_entry* e) {
  const char* s = archive_entry_pathname(e);
  return s ? s : "(no name)";
}

Status ReadFromArchive(const std::string& path, std::vector<uint8_t>* files[4]) {
  std::unique_ptr<archive, ArchiveDeleter> a(archive_read_new());
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 20) != ARCHIVE_OK) {
    return Status::IOError("cannot open archive " + path + ": " + ErrorText(a.get()));
  }
  archive_entry* e = nullptr;
  int rc;
  while ((rc = archive_read_next_header(a.get(), &e)) == ARCHIVE_OK) {
    const std::string name = BaseName(EntryName(e));
    int which = -1;
    for (int i = 0; i < 4; ++i)
      if (name == kNames[i]) which = i;
    if (which < 0 || archive_entry_filetype(e) != AE_IFREG) continue;
    std::vector<uint8_t>& out = *files[which];
    out.clear();
    const uint64_t bound = kMaxMemberBytes[which];
    const std::string member = "archive " + path + ", member " + EntryName(e);
    if (archive_entry_size_is_set(e)) {
      const la_int64_t declared = archive_entry_size(e);
      if (declared < 0 || static_cast<uint64_t>(declared) > bound) {
        return Status::Corruption(member + " declares " + std::to_string(declared) +
                                  " bytes; CIFAR-100's " + kNames[which] + " is at most " +
                                  std::to_string(bound));
      }
      out.reserve(static_cast<size_t>(declared));
    }
    char buf[1 << 16];
    la_ssize_t n;
    while ((n = archive_read_data(a.get(), buf, sizeof buf)) > 0) {
      if (out.size() + static_cast<uint64_t>(n) > bound) {
        return Status::Corruption(member + " holds more than " + std::to_string(bound) +
                                  " bytes, the most CIFAR-100's " + kNames[which] + " can be");
      }
      out.insert(out.end(), buf, buf + n);
    }
    if (n < 0) {
      return Status::Corruption(member + ": " + ErrorText(a.get()));
    }
  }
  if (rc != ARCHIVE_EOF) {
    return Status::Corruption("archive " + path + ": " + ErrorText(a.get()));
  }
  return Status::Ok();
}

Status CheckBinSize(const std::string& name, size_t size) {
  if (size == 0) return Status::Corruption(name + " is empty");
  if (size % kCifarRecordSize != 0) {
    const size_t full = size / kCifarRecordSize;
    return Status::Corruption(
        name + " is " + std::to_string(size) +
        " bytes, not a multiple of the 3074-byte record size: the record at byte offset " +
        std::to_string(full * kCifarRecordSize) + " (record " + std::to_string(full) +
        ") has only " + std::to_string(size - full * kCifarRecordSize) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

Result<CifarFiles> ReadCifar100(const std::string& src) {
  CifarFiles f;
  std::vector<uint8_t> train, test, fine, coarse;
  std::vector<uint8_t>* files[4] = {&train, &test, &fine, &coarse};
  bool found[4] = {false, false, false, false};
  if (EndsWith(src, ".tar.gz") || EndsWith(src, ".tgz") || EndsWith(src, ".tar")) {
    NL_RETURN_IF_ERROR(ReadFromArchive(src, files));
    // An empty member would be reported below as empty, a missing one as missing.
    for (int i = 0; i < 4; ++i) found[i] = !files[i]->empty();
    f.train = FileBytes::Own(std::move(train));
    f.test = FileBytes::Own(std::move(test));
  } else {
    // The .bin files are mapped, not copied: packing reads each record once.
    for (int i = 0; i < 4; ++i) {
      const std::string p = src + "/" + kNames[i];
      if (!PathExists(p)) continue;
      found[i] = true;
      if (i >= 2) NL_RETURN_IF_ERROR(ReadFileInto(p, files[i], kMaxMemberBytes[i]));
    }
    if (found[0]) {
      NL_ASSIGN_OR_RETURN(f.train, FileBytes::Map(src + "/train.bin"));
    }
    if (found[1]) {
      NL_ASSIGN_OR_RETURN(f.test, FileBytes::Map(src + "/test.bin"));
    }
  }
  for (int i = 0; i < 4; ++i) {
    if (!found[i]) {
      return Status::NotFound(src + ": no " + kNames[i] +
                              " (expected the CIFAR-100 binary version: train.bin, test.bin, "
                              "fine_label_names.txt, coarse_label_names.txt)");
    }
  }
  NL_RETURN_IF_ERROR(CheckBinSize(src + "/train.bin", f.train.size()));
  NL_RETURN_IF_ERROR(CheckBinSize(src + "/test.bin", f.test.size()));
  f.fine_names = ParseNames(fine);
  f.coarse_names = ParseNames(coarse);
  if (f.fine_names.size() != 100) {
    return Status::Corruption(src + "/fine_label_names.txt has " +
                              std::to_string(f.fine_names.size()) + " names (expected 100)");
  }
  if (f.coarse_names.size() != 20) {
    return Status::Corruption(src + "/coarse_label_names.txt has " +
                              std::to_string(f.coarse_names.size()) + " names (expected 20)");
  }
  return f;
}

Result<std::unique_ptr<CifarSplitSource>> CifarSplitSource::Create(
    std::span<const uint8_t> bin, std::string file_name, const std::vector<std::string>* classes,
    CifarLabel label) {
  NL_RETURN_IF_ERROR(CheckBinSize(file_name, bin.size()));
  std::unique_ptr<CifarSplitSource> s(new CifarSplitSource());
  s->bin_ = bin;
  s->file_name_ = std::move(file_name);
  s->classes_ = classes;
  s->label_ = label;
  const size_t off = label == CifarLabel::kCoarse ? 0 : 1;
  for (uint64_t i = 0; i < s->size(); ++i) {
    const uint8_t l = bin[i * kCifarRecordSize + off];
    if (l >= classes->size()) {
      return Status::Corruption(s->Describe(i) + ": " + (off ? "fine" : "coarse") + " label " +
                                std::to_string(l) + " out of range (" +
                                std::to_string(classes->size()) + " classes)");
    }
  }
  return s;
}

std::string CifarSplitSource::Describe(uint64_t i) const {
  return file_name_ + " record " + std::to_string(i) + " (byte offset " +
         std::to_string(i * kCifarRecordSize) + ")";
}

Status CifarSplitSource::Load(uint64_t i, SourceSample* out) const {
  const uint8_t* rec = bin_.data() + i * kCifarRecordSize;
  out->label = label_ == CifarLabel::kCoarse ? rec[0] : rec[1];
  out->decoded = true;
  out->image.width = out->image.height = kCifarSide;
  constexpr size_t kPlane = kCifarSide * kCifarSide;
  out->image.pixels.resize(kPlane * 3);
  const uint8_t* r = rec + 2;
  const uint8_t* g = r + kPlane;
  const uint8_t* b = g + kPlane;
  uint8_t* dst = out->image.pixels.data();
  for (size_t p = 0; p < kPlane; ++p) {
    dst[3 * p] = r[p];
    dst[3 * p + 1] = g[p];
    dst[3 * p + 2] = b[p];
  }
  return Status::Ok();
}

namespace {

void FakeImage(uint32_t fine, std::mt19937_64& rng, uint8_t* rec) {
  // Class c: a base colour from c, stripes with orientation c % 4 and period
  // 2 + (c / 4) % 6, contrast from c / 24; plus a random phase and noise.
  const double hue = (fine * 37 % 100) / 100.0 * 6.2831853;
  const double base[3] = {128 + 80 * std::cos(hue), 128 + 80 * std::cos(hue + 2.094),
                          128 + 80 * std::cos(hue + 4.189)};
  const int orient = static_cast<int>(fine % 4);
  const double period = 2.0 + (fine / 4) % 6;
  const double contrast = 30.0 + 15.0 * (fine / 24);
  std::uniform_real_distribution<double> phase_d(0, period);
  std::normal_distribution<double> noise(0.0, 12.0);
  const double phase = phase_d(rng);
  constexpr size_t kPlane = kCifarSide * kCifarSide;
  for (uint32_t y = 0; y < kCifarSide; ++y) {
    for (uint32_t x = 0; x < kCifarSide; ++x) {
      double t = orient == 0 ? x : orient == 1 ? y : orient == 2 ? x + y : x + kCifarSide - y;
      const double s = std::sin(6.2831853 * (t + phase) / period) > 0 ? 1.0 : -1.0;
      for (int c = 0; c < 3; ++c) {
        double v = base[c] + contrast * s * (c == orient % 3 ? 1.0 : 0.5) + noise(rng);
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        rec[2 + c * kPlane + y * kCifarSide + x] = static_cast<uint8_t>(std::lround(v));
      }
    }
  }
}

Status WriteFakeBin(const std::string& path, uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> data(n * kCifarRecordSize);
  for (uint64_t i = 0; i < n; ++i) {
    uint8_t* rec = data.data() + i * kCifarRecordSize;
    const uint32_t fine = static_cast<uint32_t>(i % 100);  // balanced classes
    rec[0] = static_cast<uint8_t>(fine / 5);
    rec[1] = static_cast<uint8_t>(fine);
    FakeImage(fine, rng, rec);
  }
  return WriteFile(path, data.data(), data.size());
}

}  // namespace

Status WriteFakeCifar100(const std::string& dir, const FakeCifarOptions& o) {
  if (o.train == 0 || o.test == 0)
    return Status::InvalidArgument("fake CIFAR-100 needs `train` and `test` > 0");
  if (o.train > kMaxFakeCifarImages || o.test > kMaxFakeCifarImages) {
    return Status::InvalidArgument("fake CIFAR-100 of " + std::to_string(o.train) + " train and " +
                                   std::to_string(o.test) + " test images: at most " +
                                   std::to_string(kMaxFakeCifarImages) + " each");
  }
  NL_RETURN_IF_ERROR(MakeDirs(dir));
  std::mt19937_64 rng(o.seed);
  NL_RETURN_IF_ERROR(WriteFakeBin(dir + "/train.bin", o.train, rng));
  NL_RETURN_IF_ERROR(WriteFakeBin(dir + "/test.bin", o.test, rng));
  std::string fine, coarse;
  char buf[32];
  for (int i = 0; i < 100; ++i) {
    std::snprintf(buf, sizeof buf, "class_%03d\n", i);
    fine += buf;
  }
  for (int i = 0; i < 20; ++i) {
    std::snprintf(buf, sizeof buf, "superclass_%02d\n", i);
    coarse += buf;
  }
  NL_RETURN_IF_ERROR(WriteFile(dir + "/fine_label_names.txt", fine.data(), fine.size()));
  return WriteFile(dir + "/coarse_label_names.txt", coarse.data(), coarse.size());
}

}  // namespace nl

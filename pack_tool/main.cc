// pack_tool: turns a dataset on disk into a verified LMDB shard set.
// A thin command line over formats/ (see docs/guide/packing.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/file_util.h"
#include "formats/manifest.h"
#include "formats/pack/cifar_source.h"
#include "formats/pack/pack.h"
#include "formats/pack/verify.h"
#include "base/parse_number.h"
#include "base/quoted_names.h"

namespace {

std::atomic<bool> g_cancel{false};
void OnSignal(int) { g_cancel.store(true); }

// The command line, for WithFlags(): set once in main before any output.
const CLI::App* g_app = nullptr;

// A library's text with each `field` that names one of our options written
// as its flag (the libraries name options by their fields).
std::string WithFlags(const std::string& text) {
  return nl::FlagsForFields(text, [](std::string_view flag) {
    for (const CLI::App* sub : g_app->get_subcommands({})) {
      for (const CLI::Option* o : sub->get_options()) {
        if (o->check_lname(std::string(flag.substr(2)))) return true;
      }
    }
    return false;
  });
}

int Fail(const nl::Status& s) {
  std::fprintf(stderr, "pack_tool: error: %s\n", WithFlags(s.ToString()).c_str());
  return s.code() == nl::StatusCode::kAborted ? 130 : 1;
}

// Bounds on counts from the command line, checked before anything is
// allocated or started (a thread each, a shard each, a pixel buffer).
constexpr uint64_t kMaxThreads = 1024;
constexpr uint64_t kMaxShards = 65536;
constexpr uint64_t kMaxFakeImages = nl::kMaxFakeCifarImages;

// The largest --max-megapixels: one RGB image of that size must fit in this
// machine's memory, and no image can be larger than the format's 2^20 x 2^20.
uint64_t MaxMegapixels() {
  const uint64_t format_max = (uint64_t{nl::kMaxRecordDim} * nl::kMaxRecordDim) >> 20;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return format_max;
  const uint64_t mem = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  return std::clamp<uint64_t>(mem / (3ull << 20), nl::kDefaultMaxMegapixels, format_max);
}

// A count given as `text` for `flag`: decimal digits only, in [lo, hi]; the
// error says the range (and what 0 means, when it is allowed).
nl::Result<uint64_t> ParseCount(const std::string& flag, const std::string& text, uint64_t lo,
                                uint64_t hi, const std::string& zero_means = "") {
  const std::string range = std::to_string(lo) +
                            (lo == 0 && !zero_means.empty() ? " (" + zero_means + ")" : "") +
                            " to " + std::to_string(hi);
  if (!text.empty() && text[0] == '-' && text.size() > 1 &&
      std::isdigit(static_cast<unsigned char>(text[1]))) {
    if (lo == 0 && hi == UINT64_MAX) {
      return nl::Status::InvalidArgument(flag + " " + text + " is negative: it must be 0 or more");
    }
    return nl::Status::InvalidArgument(flag + " " + text +
                                       " is negative: give a whole number from " + range);
  }
  nl::Result<uint64_t> v = nl::ParseUint(text, flag, lo, hi);
  if (v.ok()) return v;
  if (v.status().code() == nl::StatusCode::kOutOfRange) {
    return nl::Status::InvalidArgument(flag + " " + text + " is out of range: give " + range);
  }
  return nl::Status::InvalidArgument(flag + " '" + text +
                                     "' is not a whole number: give one from " + range);
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", b, units[u]);
  return buf;
}

// A bar on a terminal, a line every few seconds otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter(uint64_t kill_after, uint64_t interrupt_after)
      : tty_(::isatty(2)), kill_after_(kill_after), interrupt_after_(interrupt_after) {}
  void operator()(const nl::PackProgress& p) {
    // Test hooks: die (kill -9) or be interrupted (Ctrl-C) mid-pack.
    if (kill_after_ && p.done >= kill_after_) std::raise(SIGKILL);
    if (interrupt_after_ && p.done >= interrupt_after_) std::raise(SIGINT);
    const auto now = Clock::now();
    if (p.split != split_) {
      split_ = p.split;
      last_ = now - std::chrono::seconds(10);
    }
    const bool done = p.done == p.total;
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!done && since < (tty_ ? 0.1 : 5.0)) return;
    last_ = now;
    const double rate = p.seconds > 0 ? p.done / p.seconds : 0;
    if (tty_) {
      const int width = 30;
      const int filled = static_cast<int>(width * p.done / std::max<uint64_t>(p.total, 1));
      std::fprintf(stderr, "\r[%s] [%s%s] %llu/%llu  %s  %.0f img/s%s", p.split.c_str(),
                   std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                   static_cast<unsigned long long>(p.done),
                   static_cast<unsigned long long>(p.total), HumanBytes(p.bytes).c_str(), rate,
                   done ? "\n" : "");
    } else {
      std::fprintf(stderr, "[%s] %llu/%llu samples, %s, %.0f img/s\n", p.split.c_str(),
                   static_cast<unsigned long long>(p.done),
                   static_cast<unsigned long long>(p.total), HumanBytes(p.bytes).c_str(), rate);
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool tty_;
  uint64_t kill_after_, interrupt_after_;
  std::string split_;
  Clock::time_point last_;
};

void PrintSummary(const std::string& out, const nl::PackSummary& s) {
  std::printf("packed %s: %llu samples", out.c_str(), static_cast<unsigned long long>(s.samples));
  for (const auto& name : s.splits_written) {
    const nl::SplitInfo& sp = s.manifest.splits.at(name);
    std::printf(" [%s: %llu in %zu shard%s]", name.c_str(),
                static_cast<unsigned long long>(sp.num_samples), sp.shards.size(),
                sp.shards.size() == 1 ? "" : "s");
  }
  std::printf(", %llu skipped, %s, %.2f s, %.0f images/s\n",
              static_cast<unsigned long long>(s.skipped),
              HumanBytes(static_cast<double>(s.bytes)).c_str(), s.seconds,
              s.seconds > 0 ? (s.samples + s.skipped) / s.seconds : 0.0);
  for (const auto& name : s.splits_written) {
    for (const auto& f : s.manifest.splits.at(name).skipped) {
      std::printf("  skipped %s: %s\n", f.path.c_str(), f.reason.c_str());
    }
  }
}

int Info(const std::string& root, bool as_json) {
  nl::Result<nl::Manifest> m = nl::LoadManifest(root);
  if (!m.ok()) return Fail(m.status());
  if (as_json) {
    auto j = nlohmann::json::parse(nl::ManifestToJson(*m));
    j["root"] = nl::EscapeManifestString(root);
    for (auto& [name, s] : j["splits"].items()) {
      s["total_bytes"] = m->splits.at(name).total_bytes();
      s["num_shards"] = m->splits.at(name).shards.size();
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shard set   %s\n", root.c_str());
  std::printf("source      %s %s (labels: %s)\n", m->source_kind.c_str(), m->source_path.c_str(),
              m->label_kind.c_str());
  std::printf("classes     %zu:", m->classes.size());
  for (size_t i = 0; i < m->classes.size() && i < 8; ++i) std::printf(" %s", m->classes[i].c_str());
  std::printf("%s\n", m->classes.size() > 8 ? " ..." : "");
  for (const auto& [name, s] : m->splits) {
    std::string shape = "varies";
    if (s.shape) {
      shape = std::to_string((*s.shape)[0]) + "x" + std::to_string((*s.shape)[1]) + "x" +
              std::to_string((*s.shape)[2]);
    }
    std::printf(
        "split %-6s %llu samples, encoding %s, shape %s, %zu shard%s, %s, %zu skipped at pack\n",
        name.c_str(), static_cast<unsigned long long>(s.num_samples), s.encoding.c_str(),
        shape.c_str(), s.shards.size(), s.shards.size() == 1 ? "" : "s",
        HumanBytes(static_cast<double>(s.total_bytes())).c_str(), s.skipped.size());
    if (s.max_side > 0) {
      std::printf("  packed with --max-side %u (the manifest keeps each original size)\n", s.max_side);
    }
    if (s.jpeg_restarts) std::printf("  packed with --jpeg-restarts (a restart marker at every row of its JPEGs)\n");
    for (const auto& sh : s.shards) {
      std::printf("  %s  indices %llu..%llu  %s  %s\n", sh.path.c_str(),
                  static_cast<unsigned long long>(sh.first_index),
                  static_cast<unsigned long long>(sh.first_index + sh.count - 1),
                  HumanBytes(static_cast<double>(sh.bytes)).c_str(), sh.checksum.c_str());
    }
  }
  return 0;
}

// Everything the command line sets. CLI11 keeps pointers into it: it must
// not move once the subcommands are set up.
struct Flags {
  nl::PackOptions opts;
  std::string src, out, label = "fine", split = "train";
  std::string cifar_encoding = "raw", imf_encoding = "keep";
  uint64_t kill_after = 0, interrupt_after = 0;
  // Counts are taken as text and range-checked after parsing (CLI11 would
  // wrap "-1" into an unsigned option).
  std::string shards_text = "0", threads_text = "0";
  std::string max_side_text = "0", quality_text = "90";
  std::string max_mp_text;  // empty: nl::kDefaultMaxPixels (Pillow's limit)
  uint64_t max_mp_bound = MaxMegapixels();
  bool quick = false, as_json = false;  // verify, info
  std::string index_text, png_out;      // export
  nl::FakeCifarOptions fake;            // fake-cifar100
  std::string dir;
  std::string train_text = std::to_string(fake.train), test_text = std::to_string(fake.test);
};

struct Subcommands {
  CLI::App *cifar, *imf, *verify, *info, *exp, *fake;
};

std::string ThreadsHelp() {
  return "Decode threads, 0 to " + std::to_string(kMaxThreads) + " (default 0: all allowed cores)";
}

void AddMaxMegapixels(CLI::App* c, Flags* f) {
  const std::string help = "Largest image accepted, in megapixels (2^20 pixels), 1 to " +
                           std::to_string(f->max_mp_bound) + " (what this machine's memory " +
                           "holds as one RGB image); default: Pillow's limit, " +
                           std::to_string(nl::kDefaultMaxPixels) + " pixels";
  c->add_option("--max-megapixels", f->max_mp_text, help);
}

// The options cifar100 and imagefolder share.
void AddPackOptions(CLI::App* c, Flags* f, std::string* encoding, const std::string& enc_help) {
  c->add_option("--encoding", *encoding, enc_help)->capture_default_str();
  c->add_option("--shards", f->shards_text,
                "Shards per split, 0 to " + std::to_string(kMaxShards) +
                    " (default 0: one per 100,000 samples)");
  c->add_option("--threads", f->threads_text, ThreadsHelp());
  c->add_flag("--force", f->opts.force,
              "Replace an existing OUT that is a shard set (or an existing split); never "
              "deletes anything else");
  c->add_flag("--replace-non-shard-set", f->opts.replace_non_shard_set,
              "Delete and replace an existing OUT even when it is not a shard set (implies "
              "--force). OUT inside SRC, or SRC inside OUT, is always refused");
  AddMaxMegapixels(c, f);
  c->add_option("--max-side", f->max_side_text,
                "Store images whose longer side L exceeds N at round(w*N/L) x round(h*N/L) "
                "(Pillow's bilinear resize); 0 to 1048576 (default 0: as they are). With "
                "--encoding keep a resized image is re-encoded in its own format; the manifest "
                "keeps every original size");
  c->add_option("--quality", f->quality_text,
                "JPEG quality for --encoding jpeg and for resized JPEGs, 1 to 100 (default 90)");
  c->add_flag("--jpeg-restarts", f->opts.jpeg_restarts,
              "Store every JPEG (kept files too) with a restart marker at each row of 8 or 16 "
              "pixels: the same pixels, a few percent more bytes, and the loader's crops skip "
              "decoding the rows above them");
  c->add_option("--test-kill-after", f->kill_after, "Testing: SIGKILL self after N samples")
      ->group("");
  c->add_option("--test-interrupt-after", f->interrupt_after,
                "Testing: SIGINT self after N samples")
      ->group("");
}

CLI::App* AddCifar(CLI::App* app, Flags* f) {
  auto* c =
      app->add_subcommand("cifar100", "Pack CIFAR-100 (binary version): train and test splits");
  c->add_option("SRC", f->src, "cifar-100-binary directory or cifar-100-binary.tar.gz")->required();
  c->add_option("OUT", f->out, "Output shard set directory")->required();
  c->add_option("--label", f->label, "Which label to store")
      ->check(CLI::IsMember({"fine", "coarse"}))
      ->capture_default_str();
  AddPackOptions(c, f, &f->cifar_encoding, "raw (decoded RGB), png or jpeg (re-encoded, --quality)");
  return c;
}

CLI::App* AddImageFolder(CLI::App* app, Flags* f) {
  auto* c = app->add_subcommand("imagefolder", "Pack one split of an ImageFolder tree");
  c->add_option("SRC", f->src, "Root with one directory per class")->required();
  c->add_option("OUT", f->out, "Output shard set directory (new, or existing to add a split)")
      ->required();
  c->add_option("--split", f->split, "Split name")->capture_default_str();
  c->add_flag("--skip-bad", f->opts.skip_bad,
              "Skip bad images (listed in the manifest) instead of failing");
  AddPackOptions(c, f, &f->imf_encoding,
                 "keep (original file bytes), raw (decoded RGB), png or jpeg (re-encoded, --quality)");
  return c;
}

CLI::App* AddVerify(CLI::App* app, Flags* f) {
  auto* c = app->add_subcommand("verify", "Check a shard set: exit 0 when intact, 1 otherwise");
  c->add_option("OUT", f->out, "Shard set directory")->required();
  c->add_flag("--quick", f->quick, "Manifest, counts and checksums only; no image decoding");
  c->add_option("--threads", f->threads_text, ThreadsHelp());
  AddMaxMegapixels(c, f);
  return c;
}

CLI::App* AddInfo(CLI::App* app, Flags* f) {
  auto* c = app->add_subcommand("info", "Describe a shard set");
  c->add_option("OUT", f->out, "Shard set directory")->required();
  c->add_flag("--json", f->as_json, "Print JSON");
  return c;
}

CLI::App* AddExport(CLI::App* app, Flags* f) {
  auto* c = app->add_subcommand("export", "Write one stored image, decoded, as PNG");
  c->add_option("OUT", f->out, "Shard set directory")->required();
  c->add_option("--split", f->split, "Split")->required();
  c->add_option("--index", f->index_text, "Sample index (0 or more)")->required();
  c->add_option("--out", f->png_out, "PNG file to write")->required();
  AddMaxMegapixels(c, f);
  return c;
}

CLI::App* AddFakeCifar(CLI::App* app, Flags* f) {
  auto* c = app->add_subcommand("fake-cifar100",
                                "Write a synthetic CIFAR-100 in the official binary format");
  c->add_option("DIR", f->dir, "Directory to write (train.bin, test.bin, label name files)")
      ->required();
  const std::string fake_range = ", 1 to " + std::to_string(kMaxFakeImages);
  c->add_option("--train", f->train_text, "Training images" + fake_range)->capture_default_str();
  c->add_option("--test", f->test_text, "Test images" + fake_range)->capture_default_str();
  c->add_option("--seed", f->fake.seed, "Random seed")->capture_default_str();
  return c;
}

Subcommands AddSubcommands(CLI::App* app, Flags* f) {
  Subcommands s;
  s.cifar = AddCifar(app, f);
  s.imf = AddImageFolder(app, f);
  s.verify = AddVerify(app, f);
  s.info = AddInfo(app, f);
  s.exp = AddExport(app, f);
  s.fake = AddFakeCifar(app, f);
  return s;
}

// Range-checks the counts given as text into their options.
nl::Status CheckCounts(Flags* f, bool fake_cifar) {
  NL_ASSIGN_OR_RETURN(uint64_t threads, ParseCount("--threads", f->threads_text, 0, kMaxThreads,
                                                   "all allowed cores"));
  f->opts.threads = static_cast<uint32_t>(threads);
  NL_ASSIGN_OR_RETURN(uint64_t shards, ParseCount("--shards", f->shards_text, 0, kMaxShards,
                                                  "one per 100,000 samples"));
  f->opts.shards = static_cast<uint32_t>(shards);
  NL_ASSIGN_OR_RETURN(uint64_t max_side,
                      ParseCount("--max-side", f->max_side_text, 0, uint64_t{1} << 20, "no limit"));
  f->opts.max_side = static_cast<uint32_t>(max_side);
  NL_ASSIGN_OR_RETURN(uint64_t quality, ParseCount("--quality", f->quality_text, 1, 100));
  f->opts.jpeg_quality = static_cast<int>(quality);
  if (f->max_mp_text.empty()) {
    f->opts.limits.max_pixels = std::min(nl::kDefaultMaxPixels, f->max_mp_bound << 20);
  } else {
    NL_ASSIGN_OR_RETURN(uint64_t max_mp,
                        ParseCount("--max-megapixels", f->max_mp_text, 1, f->max_mp_bound));
    f->opts.limits.max_pixels = max_mp << 20;
  }
  if (fake_cifar) {
    NL_ASSIGN_OR_RETURN(f->fake.train, ParseCount("--train", f->train_text, 1, kMaxFakeImages));
    NL_ASSIGN_OR_RETURN(f->fake.test, ParseCount("--test", f->test_text, 1, kMaxFakeImages));
  }
  return nl::Status::Ok();
}

void InstallSignalHandlers() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // Over a file-size limit, writes fail with EFBIG (reported like a full disk)
  // instead of the process being killed.
  std::signal(SIGXFSZ, SIG_IGN);
}

int RunPack(const Flags& f, bool cifar) {
  nl::Result<nl::PackEncoding> enc =
      nl::ParsePackEncoding(cifar ? f.cifar_encoding : f.imf_encoding);
  if (!enc.ok()) return Fail(enc.status());
  nl::PackOptions opts = f.opts;
  opts.encoding = *enc;
  if (cifar && opts.encoding == nl::PackEncoding::kKeep) {
    return Fail(nl::Status::InvalidArgument(
        "--encoding keep needs image files; CIFAR-100 takes raw, png or jpeg"));
  }
  if (opts.jpeg_restarts && (opts.encoding == nl::PackEncoding::kRaw || opts.encoding == nl::PackEncoding::kPng)) {
    return Fail(nl::Status::InvalidArgument("--jpeg-restarts rewrites the JPEGs stored, and --encoding " +
                                            std::string(cifar ? f.cifar_encoding : f.imf_encoding) +
                                            " stores none: use --encoding keep or jpeg"));
  }
  const nl::CifarLabel which = f.label == "fine" ? nl::CifarLabel::kFine : nl::CifarLabel::kCoarse;
  nl::Result<nl::PackSummary> r = cifar ? nl::PackCifar100(f.src, f.out, which, opts)
                                        : nl::PackImageFolder(f.src, f.out, f.split, opts);
  if (!r.ok()) return Fail(r.status());
  PrintSummary(f.out, *r);
  return 0;
}

int RunVerify(const Flags& f) {
  nl::VerifyOptions vo;
  vo.quick = f.quick;
  vo.threads = f.opts.threads;
  vo.max_pixels = f.opts.limits.max_pixels;
  const auto t0 = std::chrono::steady_clock::now();
  nl::VerifyReport rep = nl::VerifyShardSet(f.out, vo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const auto& p : rep.problems) std::printf("%s: %s\n", p.where.c_str(), WithFlags(p.what).c_str());
  std::fprintf(stderr,
               "verify %s: %llu records checked, %llu images decoded, %zu problem%s, %.2f s\n",
               f.out.c_str(), static_cast<unsigned long long>(rep.records_checked),
               static_cast<unsigned long long>(rep.images_decoded), rep.problems.size(),
               rep.problems.size() == 1 ? "" : "s", secs);
  return rep.ok() ? 0 : 1;
}

int RunExport(const Flags& f) {
  nl::Result<uint64_t> index = ParseCount("--index", f.index_text, 0, UINT64_MAX);
  if (!index.ok()) return Fail(index.status());
  nl::Result<nl::DecodedSample> s =
      nl::ReadSample(f.out, f.split, *index, f.opts.limits.max_pixels);
  if (!s.ok()) return Fail(s.status());
  nl::Result<std::vector<uint8_t>> png = nl::EncodePng(s->image);
  if (!png.ok()) return Fail(png.status());
  nl::Status st = nl::WriteFileAtomically(f.png_out, std::string(png->begin(), png->end()));
  if (!st.ok()) return Fail(st);
  std::printf("wrote %s: %ux%u, label %u\n", f.png_out.c_str(), s->image.width, s->image.height,
              s->label);
  return 0;
}

int RunFakeCifar(const Flags& f) {
  nl::Status st = nl::WriteFakeCifar100(f.dir, f.fake);
  if (!st.ok()) return Fail(st);
  std::printf("wrote fake CIFAR-100 to %s: %llu train, %llu test images\n", f.dir.c_str(),
              static_cast<unsigned long long>(f.fake.train),
              static_cast<unsigned long long>(f.fake.test));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pack_tool: convert an ImageFolder tree or CIFAR-100 into an LMDB shard set"};
  app.require_subcommand(1);
  Flags f;
  const Subcommands sub = AddSubcommands(&app, &f);
  g_app = &app;
  CLI11_PARSE(app, argc, argv);
  if (nl::Status st = CheckCounts(&f, sub.fake->parsed()); !st.ok()) return Fail(st);

  InstallSignalHandlers();
  f.opts.cancel = &g_cancel;
  ProgressPrinter printer(f.kill_after, f.interrupt_after);
  f.opts.progress = [&printer](const nl::PackProgress& p) { printer(p); };
  f.opts.on_wait = [&f](const std::string& lock_file) {
    std::fprintf(stderr, "pack_tool: waiting for another pack into %s to finish (lock file %s)\n",
                 f.out.c_str(), lock_file.c_str());
  };

  if (sub.cifar->parsed()) return RunPack(f, /*cifar=*/true);
  if (sub.imf->parsed()) return RunPack(f, /*cifar=*/false);
  if (sub.verify->parsed()) return RunVerify(f);
  if (sub.info->parsed()) return Info(f.out, f.as_json);
  if (sub.exp->parsed()) return RunExport(f);
  if (sub.fake->parsed()) return RunFakeCifar(f);
  return 2;
}

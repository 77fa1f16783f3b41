#include "formats/pack/pack.h"

#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "base/file_util.h"
#include "formats/lmdb_env.h"
#include "formats/pack/verify.h"
#include "formats/shard.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

namespace fs = std::filesystem;

PackOptions Opts(PackEncoding e = PackEncoding::kKeep, uint32_t threads = 2) {
  PackOptions o;
  o.encoding = e;
  o.threads = threads;
  return o;
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// An ImageFolder of PNGs and JPEGs: classes a, b, c with 4, 3, 5 images.
void MakeImageFolder(const std::string& root, uint32_t seed = 0) {
  const int counts[] = {4, 3, 5};
  for (int c = 0; c < 3; ++c) {
    const std::string dir = root + "/" + std::string(1, static_cast<char>('a' + c));
    ASSERT_TRUE(MakeDirs(dir).ok());
    for (int i = 0; i < counts[c]; ++i) {
      Image img = testing::PatternImage(16 + i, 12, seed + c * 10 + i);
      char name[32];
      if (i == 1) {
        std::snprintf(name, sizeof name, "/img%02d.jpg", i);
        testing::WriteBytes(dir + name, *EncodeJpeg(img.pixels, img.width, img.height, 3));
      } else {
        std::snprintf(name, sizeof name, "/img%02d.png", i);
        testing::WriteBytes(dir + name, *EncodePng(img));
      }
    }
  }
}

TEST(PackCifar, PacksVerifiesAndExportsExactPixels) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 300, .test = 40, .seed = 5}).ok());
  PackOptions o = Opts(PackEncoding::kRaw);
  o.shards = 3;
  Result<PackSummary> s = PackCifar100(d / "src", d / "out", CifarLabel::kFine, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples, 340u);
  Result<Manifest> m = LoadManifest(d / "out");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->classes.size(), 100u);
  EXPECT_EQ(m->splits.at("train").shards.size(), 3u);
  EXPECT_EQ(m->splits.at("train").encoding, "raw");
  EXPECT_EQ(*m->splits.at("test").shape, (std::array<uint32_t, 3>{32, 32, 3}));
  VerifyReport rep = VerifyShardSet(d / "out", {});
  EXPECT_TRUE(rep.ok()) << rep.problems[0].where << ": " << rep.problems[0].what;
  EXPECT_EQ(rep.records_checked, 340u);

  Result<CifarFiles> f = ReadCifar100(d / "src");
  auto src =
      CifarSplitSource::Create(f->train.span(), "train.bin", &f->fine_names, CifarLabel::kFine);
  for (uint64_t i : {0u, 101u, 299u}) {
    SourceSample want;
    ASSERT_TRUE((*src)->Load(i, &want).ok());
    Result<DecodedSample> got = ReadSample(d / "out", "train", i);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->image.pixels, want.image.pixels);
    EXPECT_EQ(got->label, want.label);
  }
  // PNG encoding stores the same pixels losslessly.
  o.encoding = PackEncoding::kPng;
  ASSERT_TRUE(PackCifar100(d / "src", d / "out_png", CifarLabel::kCoarse, o).ok());
  Result<DecodedSample> raw = ReadSample(d / "out", "test", 7);
  Result<DecodedSample> png = ReadSample(d / "out_png", "test", 7);
  ASSERT_TRUE(png.ok());
  EXPECT_EQ(raw->image.pixels, png->image.pixels);
  EXPECT_EQ(png->label, raw->label / 5);
}

TEST(PackCifar, DeterministicWhateverTheThreadCount) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 500, .test = 50}).ok());
  ASSERT_TRUE(
      PackCifar100(d / "src", d / "a", CifarLabel::kFine, Opts(PackEncoding::kPng, 1)).ok());
  ASSERT_TRUE(
      PackCifar100(d / "src", d / "b", CifarLabel::kFine, Opts(PackEncoding::kPng, 4)).ok());
  for (const char* f : {"train/shard-00000/data.mdb", "test/shard-00000/data.mdb"}) {
    EXPECT_EQ(*ReadFileBytes(d / (std::string("a/") + f)),
              *ReadFileBytes(d / (std::string("b/") + f)))
        << f;
  }
}

TEST(PackCifar, ExistingOutRefusedUnlessForce) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 10, .test = 5}).ok());
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts()).ok());
  Status s = PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts()).status();
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("already exists (use `force`"), std::string::npos) << s.ToString();
  PackOptions o = Opts();
  o.force = true;
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kCoarse, o).ok());
  EXPECT_EQ(LoadManifest(d / "out")->label_kind, "coarse");
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"out", "src"}));
}

TEST(PackImageFolder, KeepStoresOriginalBytesInTorchvisionOrder) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  Result<PackSummary> s = PackImageFolder(d / "src", d / "out", "train", Opts());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples, 12u);
  Result<Manifest> m = LoadManifest(d / "out");
  EXPECT_EQ(m->classes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(m->splits.at("train").encoding, "mixed");
  EXPECT_FALSE(m->splits.at("train").shape.has_value());
  auto reader = SplitReader::Open(d / "out", *m, "train");
  ASSERT_TRUE(reader.ok());
  auto txn = (*reader)->BeginRead();
  Result<RecordView> r = txn.Read(4);  // first image of class b
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->header.label, 1u);
  std::vector<uint8_t> file = *ReadFileBytes(d / "src/b/img00.png");
  EXPECT_EQ(std::vector<uint8_t>(r->payload.begin(), r->payload.end()), file);
  r = txn.Read(5);
  EXPECT_EQ(r->header.encoding, Encoding::kJpeg);
  EXPECT_TRUE(VerifyShardSet(d / "out", {}).ok());
}

// --jpeg-restarts: a JPEG gets a restart marker at every row; one the
// rewrite cannot encode is stored as the file is, and the pack goes on.
TEST(PackImageFolder, JpegRestartsStoresAFileItCannotRewriteAsItIs) {
  testing::ScratchDir d;
  const std::vector<uint8_t> cannot = testing::JpegRowRestartsCannotEncode();
  const std::vector<uint8_t> plain = *EncodeJpeg(testing::PatternImage(40, 40, 3).pixels, 40, 40, 3);
  ASSERT_TRUE(MakeDirs(d / "src/a").ok());
  testing::WriteBytes(d / "src/a/0_cannot.jpg", cannot);
  testing::WriteBytes(d / "src/a/1_plain.jpg", plain);
  PackOptions o = Opts();
  o.jpeg_restarts = true;
  Result<PackSummary> s = PackImageFolder(d / "src", d / "out", "train", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples, 2u);
  EXPECT_TRUE(s->manifest.splits.at("train").jpeg_restarts);
  Result<Manifest> m = LoadManifest(d / "out");
  auto reader = SplitReader::Open(d / "out", *m, "train");
  ASSERT_TRUE(reader.ok());
  auto txn = (*reader)->BeginRead();
  Result<RecordView> r = txn.Read(0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::vector<uint8_t>(r->payload.begin(), r->payload.end()), cannot);
  r = txn.Read(1);
  ASSERT_TRUE(r.ok());
  const std::vector<uint8_t> stored(r->payload.begin(), r->payload.end());
  EXPECT_EQ(stored, *AddJpegRowRestarts(plain));
  EXPECT_NE(stored, plain);
  EXPECT_EQ(DecodeImage(stored)->pixels, DecodeImage(plain)->pixels);
}

TEST(PackImageFolder, BadFileStopsThePackAndLeavesNothing) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  std::vector<uint8_t> png = *ReadFileBytes(d / "src/b/img02.png");
  png.resize(png.size() / 2);
  testing::WriteBytes(d / "src/b/img02.png", png);
  Status s = PackImageFolder(d / "src", d / "out", "train", Opts()).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message().rfind(d / "src/b/img02.png: corrupt PNG: truncated PNG", 0), 0u)
      << s.ToString();
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"src"}));  // no OUT, no temporaries
}

TEST(PackImageFolder, SkipBadCountsAndListsReasons) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  testing::WriteText(d / "src/a/zz_text.jpg", "hello");
  testing::WriteBytes(d / "src/c/empty.png", {});
  PackOptions o = Opts();
  o.skip_bad = true;
  Result<PackSummary> s = PackImageFolder(d / "src", d / "out", "train", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples, 12u);
  EXPECT_EQ(s->skipped, 2u);
  Result<Manifest> m = LoadManifest(d / "out");
  const auto& skipped = m->splits.at("train").skipped;
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].path, d / "src/a/zz_text.jpg");
  EXPECT_NE(skipped[0].reason.find("not an image"), std::string::npos);
  EXPECT_EQ(skipped[1].path, d / "src/c/empty.png");
  EXPECT_EQ(m->splits.at("train").num_samples, 12u);
  EXPECT_TRUE(VerifyShardSet(d / "out", {}).ok());
}

TEST(PackImageFolder, CancelledPackLeavesNothing) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 3000, .test = 10}).ok());
  std::atomic<bool> cancel{false};
  PackOptions o = Opts(PackEncoding::kRaw);
  o.cancel = &cancel;
  o.progress = [&](const PackProgress& p) {
    if (p.done >= 1024) cancel = true;
  };
  Status s = PackCifar100(d / "src", d / "out", CifarLabel::kFine, o).status();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"src"}));
}

TEST(PackImageFolder, AddSplitToExistingOut) {
  testing::ScratchDir d;
  MakeImageFolder(d / "train_src", 0);
  MakeImageFolder(d / "val_src", 100);
  ASSERT_TRUE(PackImageFolder(d / "train_src", d / "out", "train", Opts()).ok());
  const std::vector<uint8_t> train_before = *ReadFileBytes(d / "out/train/shard-00000/data.mdb");
  ASSERT_TRUE(PackImageFolder(d / "val_src", d / "out", "val", Opts(PackEncoding::kRaw)).ok());
  Result<Manifest> m = LoadManifest(d / "out");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->splits.size(), 2u);
  EXPECT_EQ(m->splits.at("val").encoding, "raw");
  EXPECT_EQ(*ReadFileBytes(d / "out/train/shard-00000/data.mdb"), train_before);
  EXPECT_TRUE(VerifyShardSet(d / "out", {}).ok());
  EXPECT_EQ(Listing(d / "out"), (std::vector<std::string>{"manifest.json", "train", "val"}));

  // Same split again: refused without force, replaced with it.
  Status again = PackImageFolder(d / "val_src", d / "out", "val", Opts()).status();
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  PackOptions force = Opts();
  force.force = true;
  ASSERT_TRUE(PackImageFolder(d / "val_src", d / "out", "val", force).ok());
  EXPECT_EQ(LoadManifest(d / "out")->splits.at("val").encoding, "mixed");
  EXPECT_TRUE(VerifyShardSet(d / "out", {}).ok());

  // Different classes: a clear error, nothing changed.
  ASSERT_TRUE(MakeDirs(d / "val_src/d").ok());
  testing::WriteBytes(d / "val_src/d/x.png", *EncodePng(testing::PatternImage(4, 4, 1)));
  Status s = PackImageFolder(d / "val_src", d / "out", "test", Opts()).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("differ"), std::string::npos);
  EXPECT_EQ(LoadManifest(d / "out")->splits.size(), 2u);
}

// --- Safety: concurrent packs, --force, names, limits ----------------------

// Packs into one OUT from several threads (separate lock file descriptions,
// as separate processes would have).
TEST(PackSafety, ConcurrentSplitPacksIntoOneOutAllLand) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  std::vector<Status> results(4);
  {
    std::vector<std::jthread> packs;
    for (int i = 0; i < 4; ++i) {
      packs.emplace_back([&, i] {
        results[i] =
            PackImageFolder(d / "src", d / "out", std::string("s").append(std::to_string(i)),
                            Opts(PackEncoding::kKeep, 1))
                .status();
      });
    }
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].ToString();
  Result<Manifest> m = LoadManifest(d / "out");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->splits.size(), 4u);
  EXPECT_EQ(Listing(d / "out"),
            (std::vector<std::string>{"manifest.json", "s0", "s1", "s2", "s3"}));
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"out", "src"}));  // no lock file left
  EXPECT_TRUE(VerifyShardSet(d / "out", {}).ok());
}

TEST(PackSafety, TwoPacksIntoOneNewOutOneWinsOneRefused) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 2000, .test = 10}).ok());
  MakeImageFolder(d / "imf");
  for (bool cifar : {true, false}) {
    const std::string out = d / (cifar ? "c_out" : "i_out");
    std::vector<Status> results(2);
    {
      std::vector<std::jthread> packs;
      for (int i = 0; i < 2; ++i) {
        packs.emplace_back([&, i] {
          results[i] =
              cifar ? PackCifar100(d / "src", out, CifarLabel::kFine, Opts(PackEncoding::kRaw, 1))
                          .status()
                    : PackImageFolder(d / "imf", out, "train", Opts()).status();
        });
      }
    }
    const int wins = results[0].ok() + results[1].ok();
    EXPECT_EQ(wins, 1) << results[0].ToString() << " / " << results[1].ToString();
    const Status& lost = results[0].ok() ? results[1] : results[0];
    EXPECT_EQ(lost.code(), StatusCode::kAlreadyExists) << lost.ToString();
    EXPECT_NE(lost.message().find("already exists"), std::string::npos) << lost.ToString();
    EXPECT_TRUE(VerifyShardSet(out, {}).ok());
  }
}

TEST(PackSafety, WaitsForAHeldOutLockAndSaysWhichFile) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  Result<FileLock> held = FileLock::Acquire(PackLockPath(d / "out"), nullptr, nullptr);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  std::vector<std::string> waited;
  PackOptions o = Opts();
  o.on_wait = [&](const std::string& lock_file) {
    waited.push_back(lock_file);
    held->Release();  // the other pack finishes
  };
  Result<PackSummary> s = PackImageFolder(d / "src", d / "out", "train", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(waited, (std::vector<std::string>{d / "out.pack-lock"}));

  // Interrupted while waiting: Aborted, nothing written.
  held = FileLock::Acquire(PackLockPath(d / "out2"), nullptr, nullptr);
  ASSERT_TRUE(held.ok());
  std::atomic<bool> cancel{false};
  o.cancel = &cancel;
  o.on_wait = [&](const std::string&) { cancel = true; };
  Status st = PackImageFolder(d / "src", d / "out2", "train", o).status();
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_NE(st.message().find("waiting for the lock " + d / "out2.pack-lock"), std::string::npos)
      << st.ToString();
  EXPECT_FALSE(PathExists(d / "out2"));
}

TEST(PackSafety, TemporaryWithAHeldLockIsKeptWhateverItsPid) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 20, .test = 5}).ok());
  // pid 2^22 + 7 is above pid_max on Linux: no such process here. The
  // temporary's owner may run in another PID namespace, so only its lock counts.
  const std::string held_tmp = d / "out.tmp-4194311";
  const std::string stale_tmp = d / "out.tmp-4194312";
  ASSERT_NE(::kill(4194311, 0), 0);
  ASSERT_TRUE(MakeDirs(held_tmp + "/train").ok());
  ASSERT_TRUE(MakeDirs(stale_tmp + "/train").ok());
  testing::WriteText(stale_tmp + "/.pack-lock", "");  // a lock file no one holds
  // Held through another open file description, as another process would.
  const int fd = ::open((held_tmp + "/.pack-lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts(PackEncoding::kRaw)).ok());
  EXPECT_TRUE(PathExists(held_tmp + "/train")) << "a temporary in use was removed";
  EXPECT_FALSE(PathExists(stale_tmp)) << "a stale temporary was kept";
  ::close(fd);
  // Once its lock is free it is stale: the next pack into OUT removes it.
  PackOptions o = Opts(PackEncoding::kRaw);
  o.force = true;
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, o).ok());
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"out", "src"}));
}

TEST(PackSafety, SplitTemporaryInsideOutIsKeptWhileHeldAndRemovedWhenStale) {
  testing::ScratchDir d;
  MakeImageFolder(d / "src");
  ASSERT_TRUE(PackImageFolder(d / "src", d / "out", "train", Opts()).ok());
  // Per-split temporaries are TemporaryPath(OUT/.<split>); pids above pid_max.
  const std::string held_tmp = d / "out/.val.tmp-4194311";
  const std::string stale_tmp = d / "out/.test.tmp-4194312";
  ASSERT_TRUE(MakeDirs(held_tmp + "/val").ok());
  ASSERT_TRUE(MakeDirs(stale_tmp + "/test").ok());
  testing::WriteText(stale_tmp + "/.pack-lock", "");  // a lock file no one holds
  const int fd = ::open((held_tmp + "/.pack-lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  ASSERT_TRUE(PackImageFolder(d / "src", d / "out", "extra", Opts()).ok());
  EXPECT_TRUE(PathExists(held_tmp + "/val")) << "a temporary in use was removed";
  EXPECT_FALSE(PathExists(stale_tmp)) << "a stale temporary was kept";
  ::close(fd);
  ASSERT_TRUE(PackImageFolder(d / "src", d / "out", "more", Opts()).ok());
  EXPECT_EQ(Listing(d / "out"),
            (std::vector<std::string>{"extra", "manifest.json", "more", "train"}));
}

TEST(PackSafety, ForceNeverDeletesTheSourceOrANonShardSet) {
  testing::ScratchDir d;
  MakeImageFolder(d / "fsrc/train");
  testing::WriteText(d / "fsrc/notes.txt", "keep me");
  std::error_code ec;
  fs::create_directory_symlink(d / "fsrc", d / "link2", ec);
  ASSERT_FALSE(ec) << ec.message();
  PackOptions force = Opts();
  force.force = true;
  force.replace_non_shard_set = true;  // not even this deletes the source
  struct Case {
    std::string src, out, want;
  } cases[] = {
      {d / "fsrc/train", d / "fsrc", "inside OUT"},          // OUT contains SRC
      {d / "fsrc/train", d / "link2", "inside OUT"},         // ... through a symlink
      {d / "fsrc/train", d / "fsrc/train", "inside"},        // the same directory
      {d / "fsrc/train", d / "fsrc/train/a", "inside SRC"},  // SRC contains OUT
  };
  for (const Case& c : cases) {
    Status s = PackImageFolder(c.src, c.out, "train", force).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.out << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.want), std::string::npos) << s.ToString();
  }
  ASSERT_TRUE(WriteFakeCifar100(d / "fsrc/c100", {.train = 10, .test = 5}).ok());
  Status s = PackCifar100(d / "fsrc/c100", d / "fsrc", CifarLabel::kFine, force).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("inside OUT"), std::string::npos) << s.ToString();
  EXPECT_EQ(Listing(d / "fsrc"), (std::vector<std::string>{"c100", "notes.txt", "train"}));
  EXPECT_EQ(Listing(d / "fsrc/train"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(Listing(d / "fsrc/train/a").size(), 4u);

  // An OUT that is not a shard set: --force alone refuses, for both commands.
  ASSERT_TRUE(MakeDirs(d / "other").ok());
  testing::WriteText(d / "other/thesis.tex", "precious");
  PackOptions only_force = Opts();
  only_force.force = true;
  for (bool cifar : {true, false}) {
    Status r =
        cifar ? PackCifar100(d / "fsrc/c100", d / "other", CifarLabel::kFine, only_force).status()
              : PackImageFolder(d / "fsrc/train", d / "other", "train", only_force).status();
    EXPECT_EQ(r.code(), StatusCode::kAlreadyExists) << r.ToString();
    EXPECT_NE(r.message().find("is not a shard set"), std::string::npos) << r.ToString();
    EXPECT_NE(r.message().find("`replace_non_shard_set`"), std::string::npos) << r.ToString();
    EXPECT_TRUE(PathExists(d / "other/thesis.tex"));
  }
  // Named plainly, it is replaced.
  PackOptions replace = Opts();
  replace.replace_non_shard_set = true;
  ASSERT_TRUE(PackImageFolder(d / "fsrc/train", d / "other", "train", replace).ok());
  EXPECT_FALSE(PathExists(d / "other/thesis.tex"));
  EXPECT_TRUE(VerifyShardSet(d / "other", {}).ok());
}

TEST(PackSafety, NamesThatAreNotUtf8PackAndReadBackExactly) {
  testing::ScratchDir d;
  const std::string cls = "caf\xe9";        // Latin-1, not UTF-8
  const std::string bad = "bad\xff.jpg";    // a skipped file with such a name
  const std::string slash = "back\\slash";  // the escape character itself
  for (const std::string& c : {cls, slash, std::string("z\xc3\xa9")}) {
    ASSERT_TRUE(MakeDirs(d / ("src/" + c)).ok());
    testing::WriteBytes(d / ("src/" + c + "/img\xfe.png"),
                        *EncodePng(testing::PatternImage(8, 8, 3)));
  }
  testing::WriteText(d / ("src/" + cls + "/" + bad), "not an image");
  PackOptions o = Opts();
  o.skip_bad = true;
  Result<PackSummary> s = PackImageFolder(d / "src", d / ("out\xf0"), "train", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->samples, 3u);
  Result<Manifest> m = LoadManifest(d / ("out\xf0"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->classes, (std::vector<std::string>{slash, cls, "z\xc3\xa9"}));
  ASSERT_EQ(m->splits.at("train").skipped.size(), 1u);
  EXPECT_EQ(m->splits.at("train").skipped[0].path, d / ("src/" + cls + "/" + bad));
  EXPECT_EQ(m->source_path, d / "src");
  const std::string text = *ReadFileToString(d / ("out\xf0/manifest.json"));
  EXPECT_NE(text.find("\"caf\\\\xE9\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"back\\\\\\\\slash\""), std::string::npos) << text;
  EXPECT_TRUE(VerifyShardSet(d / ("out\xf0"), {}).ok());
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"out\xf0", "src"}));
}

// Runs `body` in a child process (for resource limits) and returns its exit
// code; the child prints what it checks.
int InChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(PackSafety, PacksUnderAnAddressSpaceLimitGrowingTheMap) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's shadow memory does not fit under an address-space limit";
#endif
  testing::ScratchDir d;
  // 24,000 raw records of 3,104 bytes: about 90 MiB in one shard, more than
  // the first map, so the map grows.
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 24000, .test = 10}).ok());
  const int rc = InChild([&] {
    struct rlimit lim {};
    lim.rlim_cur = lim.rlim_max = 8000000ull * 1024;  // ulimit -v 8000000
    if (::setrlimit(RLIMIT_AS, &lim) != 0) return 2;
    Result<PackSummary> s =
        PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts(PackEncoding::kRaw, 2));
    if (!s.ok()) std::fprintf(stderr, "child: %s\n", s.status().ToString().c_str());
    return s.ok() ? 0 : 1;
  });
  ASSERT_EQ(rc, 0);
  VerifyReport rep = VerifyShardSet(d / "out", {.quick = true});
  EXPECT_TRUE(rep.ok());
  EXPECT_EQ(rep.records_checked, 24010u);
  EXPECT_GT(*FileSize(d / "out/train/shard-00000/data.mdb"), uint64_t{64} << 20);
}

TEST(PackSafety, FileSizeLimitIsNamedNotInputOutputError) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 2000, .test = 10}).ok());
  const std::string msg_file = d / "msg";
  const int rc = InChild([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {};
    lim.rlim_cur = lim.rlim_max = 2 << 20;  // ulimit -f 2048
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 2;
    Status s =
        PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts(PackEncoding::kRaw, 1)).status();
    const std::string text = s.ToString();
    FILE* f = std::fopen(msg_file.c_str(), "w");
    if (!f) return 3;
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return s.ok() ? 1 : 0;
  });
  ASSERT_EQ(rc, 0);
  const std::string msg = *ReadFileToString(msg_file);
  EXPECT_NE(msg.find("train/shard-00000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("file-size limit (ulimit -f) of 2097152 bytes"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("Input/output error"), std::string::npos) << msg;
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"msg", "src"}));
}

TEST(PackSafety, DiskFullMessagesSayNoSpaceAndNameTheFile) {
  testing::ScratchDir d;
  const std::string file = d / "train/shard-00000/data.mdb";
  Status s = LmdbWriteStatus(ENOSPC, "cannot commit shard train/shard-00000", file);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message().rfind("cannot commit shard train/shard-00000: no space left on device "
                              "writing " +
                                  file,
                              0),
            0u)
      << s.ToString();
  // A plain EIO with space to spare stays what it is.
  Status eio = LmdbWriteStatus(EIO, "cannot commit shard x", d / "data.mdb");
  EXPECT_EQ(eio.message(), "cannot commit shard x: Input/output error");
  EXPECT_EQ(Status::FromErrno("cannot write m.json", ENOSPC).message(),
            "cannot write m.json: No space left on device");
}

}  // namespace
}  // namespace nl

namespace nl {
namespace {

// A source of decoded 4x4 images whose Load throws `E` at sample `throw_at`
// (from a worker thread of the pack).
template <typename E>
class ThrowingSource : public SampleSource {
 public:
  ThrowingSource(uint64_t n, uint64_t throw_at) : n_(n), throw_at_(throw_at) {}
  uint64_t size() const override { return n_; }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::string Describe(uint64_t i) const override { return "fake sample " + std::to_string(i); }
  Status Load(uint64_t i, SourceSample* out) const override {
    if (i == throw_at_) {
      if constexpr (std::is_same_v<E, std::bad_alloc>) {
        throw std::bad_alloc();
      } else {
        throw E("disk on fire at sample " + std::to_string(i));
      }
    }
    out->label = 0;
    out->decoded = true;
    out->image = testing::PatternImage(4, 4, static_cast<uint32_t>(i));
    return Status::Ok();
  }

 private:
  uint64_t n_, throw_at_;
  std::vector<std::string> classes_{"only"};
};

// A worker whose Load throws std::bad_alloc: the pack fails with
// ResourceExhausted naming the split (it used to std::terminate).
TEST(PackWorkers, OutOfMemoryInAWorkerIsAnErrorNotTerminate) {
  for (uint32_t threads : {1u, 4u}) {
    for (bool skip_bad : {false, true}) {
      SCOPED_TRACE(std::to_string(threads) + " threads" + (skip_bad ? ", skip_bad" : ""));
      testing::ScratchDir d;
      ThrowingSource<std::bad_alloc> source(2000, 700);
      PackOptions o = Opts(PackEncoding::kRaw, threads);
      o.skip_bad = skip_bad;  // an exception is not a bad sample
      Result<SplitInfo> r = PackSplit(source, d.path(), "train", o);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
      EXPECT_NE(r.status().message().find("pack of split 'train'"), std::string::npos)
          << r.status().ToString();
      EXPECT_NE(r.status().message().find("out of memory"), std::string::npos)
          << r.status().ToString();
    }
  }
}

// A worker that dies (here: an exception) never fills its slots: the writer,
// waiting for them, must stop with the worker's error instead of hanging.
TEST(PackWorkers, AFailedWorkerStopsThePackInsteadOfHanging) {
  for (uint64_t throw_at : {uint64_t{0}, uint64_t{15}, uint64_t{1234}, uint64_t{4999}}) {
    SCOPED_TRACE("throws at " + std::to_string(throw_at));
    testing::ScratchDir d;
    ThrowingSource<std::runtime_error> source(5000, throw_at);
    Result<SplitInfo> r = PackSplit(source, d.path(), "train", Opts(PackEncoding::kRaw, 4));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status().ToString();
    EXPECT_NE(r.status().message().find("pack of split 'train'"), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find("disk on fire at sample " + std::to_string(throw_at)),
              std::string::npos)
        << r.status().ToString();
  }
  // The same source without the throw packs (the fake itself is sound).
  testing::ScratchDir d;
  ThrowingSource<std::runtime_error> fine(5000, 5000);
  Result<SplitInfo> r = PackSplit(fine, d.path(), "train", Opts(PackEncoding::kRaw, 4));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_samples, 5000u);
}

}  // namespace
}  // namespace nl

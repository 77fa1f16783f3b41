#include "formats/pack.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "formats/file_util.h"
#include "formats/shard.h"
#include "formats/test_util.h"
#include "formats/verify.h"

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
  ASSERT_TRUE(MakeDirs(d / "out").ok());
  Status s = PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts()).status();
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  PackOptions o = Opts();
  o.force = true;
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, o).ok());
  EXPECT_TRUE(LoadManifest(d / "out").ok());
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

TEST(Verify, FindsDamageInShardFiles) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 200, .test = 20}).ok());
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts(PackEncoding::kRaw)).ok());
  // Flip one byte inside a record's pixels: the last record's payload is near
  // the end of the data pages; find one by content instead of guessing offsets.
  const std::string path = d / "out/train/shard-00000/data.mdb";
  std::vector<uint8_t> db = *ReadFileBytes(path);
  Result<DecodedSample> s = ReadSample(d / "out", "train", 150);
  ASSERT_TRUE(s.ok());
  auto it = std::search(db.begin(), db.end(), s->image.pixels.begin(), s->image.pixels.end());
  ASSERT_NE(it, db.end());
  it[100] ^= 0x55;
  testing::WriteBytes(path, db);
  VerifyReport rep = VerifyShardSet(d / "out", {.quick = true});
  ASSERT_FALSE(rep.ok());
  bool named = false;
  for (const auto& p : rep.problems) {
    if (p.where == "train/shard-00000 index 150" &&
        p.what.find("payload checksum mismatch") != std::string::npos)
      named = true;
  }
  EXPECT_TRUE(named);
  EXPECT_NE(rep.problems[0].what.find("checksum"), std::string::npos);
}

TEST(Verify, MissingShardAndManifest) {
  testing::ScratchDir d;
  ASSERT_TRUE(WriteFakeCifar100(d / "src", {.train = 20, .test = 20}).ok());
  ASSERT_TRUE(PackCifar100(d / "src", d / "out", CifarLabel::kFine, Opts(PackEncoding::kRaw)).ok());
  ASSERT_TRUE(RemoveAll(d / "out/test").ok());
  VerifyReport rep = VerifyShardSet(d / "out", {});
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_EQ(rep.problems[0].where, "test/shard-00000");
  ASSERT_TRUE(RemoveAll(d / "out/manifest.json").ok());
  rep = VerifyShardSet(d / "out", {});
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].what.find("Not found"), std::string::npos);
}

}  // namespace
}  // namespace nl

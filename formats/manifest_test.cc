#include "formats/manifest.h"

#include <gtest/gtest.h>

#include "formats/test_util.h"

namespace nl {
namespace {

Manifest Sample() {
  Manifest m;
  m.source_kind = "cifar100";
  m.source_path = "/data/cifar-100-binary";
  m.label_kind = "fine";
  m.classes = {"apple", "bear"};
  SplitInfo s;
  s.source = "/data/cifar-100-binary/train.bin";
  s.num_samples = 5;
  s.encoding = "raw";
  s.shape = std::array<uint32_t, 3>{32, 32, 3};
  s.shards = {{"train/shard-00000", 0, 3, 8192, "crc32c:0000abcd"},
              {"train/shard-00001", 3, 2, 4096, "crc32c:1234abcd"}};
  s.skipped = {{"x.png", "Corruption: truncated"}};
  m.splits["train"] = s;
  return m;
}

TEST(Manifest, RoundTripThroughFile) {
  testing::ScratchDir dir;
  Manifest m = Sample();
  ASSERT_TRUE(SaveManifest(dir.path(), m).ok());
  Result<Manifest> back = LoadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  const SplitInfo* t = back->FindSplit("train");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shards[1].first_index, 3u);
  EXPECT_EQ(t->total_bytes(), 12288u);
  EXPECT_EQ((*t->shape)[0], 32u);
  EXPECT_EQ(t->skipped[0].path, "x.png");
  EXPECT_EQ(back->FindSplit("test"), nullptr);
}

TEST(Manifest, InconsistentShardsRejected) {
  Manifest m = Sample();
  m.splits["train"].shards[1].first_index = 4;
  Status s = ManifestFromJson(ManifestToJson(m), "m.json").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "m.json: split 'train' shard 1 starts at index 4, expected 3");
  m = Sample();
  m.splits["train"].num_samples = 6;
  EXPECT_EQ(ManifestFromJson(ManifestToJson(m), "m.json").status().message(),
            "m.json: split 'train' shards hold 5 records but num_samples is 6");
  m = Sample();
  m.splits["train"].shards[0].path = "../../etc";
  EXPECT_NE(ManifestFromJson(ManifestToJson(m), "m.json").status().message().find("unsafe path"),
            std::string::npos);
}

TEST(Manifest, BadJsonAndVersion) {
  EXPECT_EQ(ManifestFromJson("{not json", "m.json").status().code(), StatusCode::kCorruption);
  std::string j = ManifestToJson(Sample());
  j.replace(j.find("\"format_version\": 1"), 19, "\"format_version\": 7");
  EXPECT_EQ(ManifestFromJson(j, "m.json").status().message(),
            "m.json: manifest format_version 7 is not supported (this build reads 1)");
  testing::ScratchDir dir;
  EXPECT_EQ(LoadManifest(dir.path()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace nl

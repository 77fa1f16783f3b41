#include "formats/manifest.h"

#include <gtest/gtest.h>

#include "tests/support/test_util.h"

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

// --max-side: the limit and every sample's original size survive the file;
// a text of the wrong length, not base64, or with a side out of bounds is
// Corruption (the length at load, the rest when decoded).
TEST(Manifest, OriginalSizesRoundTripAndDamageIsNamed) {
  testing::ScratchDir dir;
  Manifest m = Sample();
  const std::vector<std::array<uint32_t, 2>> sizes = {
      {640, 480}, {1, 1}, {1u << 20, 3}, {500, 375}, {17, 4000}};
  m.splits["train"].max_side = 256;
  m.splits["train"].original_sizes = EncodeOriginalSizes(sizes);
  ASSERT_TRUE(SaveManifest(dir.path(), m).ok());
  Result<Manifest> back = LoadManifest(dir.path());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->FindSplit("train")->max_side, 256u);
  Result<std::vector<std::array<uint32_t, 2>>> got = OriginalSizes(*back->FindSplit("train"));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, sizes);
  // Without --max-side: neither field is written, and no sizes.
  EXPECT_EQ(ManifestToJson(Sample()).find("original_sizes"), std::string::npos);
  EXPECT_TRUE(OriginalSizes(Sample().splits["train"])->empty());

  Manifest shorter = m;
  shorter.splits["train"].original_sizes.resize(shorter.splits["train"].original_sizes.size() - 4);
  Status st = ManifestFromJson(ManifestToJson(shorter), "m.json").status();
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_EQ(st.message(),
            "m.json: split 'train' original_sizes holds 52 characters, expected 56 (max_side 256, "
            "5 samples)");
  SplitInfo bad = m.splits["train"];
  bad.original_sizes[7] = '*';
  EXPECT_EQ(OriginalSizes(bad).status().message(), "original_sizes is not base64: character 7 is \"*\"");
  bad = m.splits["train"];
  ASSERT_EQ(bad.original_sizes.substr(52), "AA==");
  bad.original_sizes[53] = 'B';  // bits past the last byte: not what the packer writes
  EXPECT_EQ(OriginalSizes(bad).status().message(),
            "original_sizes is not canonical base64: its last bits are not 0");
  bad.original_sizes = m.splits["train"].original_sizes;
  bad.original_sizes[54] = 'A';  // padding that is not '='
  EXPECT_EQ(OriginalSizes(bad).status().message(), "original_sizes is not base64: character 54 is \"A\"");
  bad.original_sizes = EncodeOriginalSizes({{640, 480}, {0, 1}, {1, 1}, {1, 1}, {1, 1}});
  EXPECT_EQ(OriginalSizes(bad).status().message(),
            "original_sizes: sample 1 has a side of 0 (sides are 1 .. 1048576)");
  std::string text = ManifestToJson(m);
  const size_t at = text.find("\"max_side\": 256");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 15, "\"max_side\": 0  ");
  EXPECT_EQ(ManifestFromJson(text, "m.json").status().message(),
            "m.json: split 'train' max_side 0 is outside 1 .. 1048576");
}

TEST(Manifest, BadJsonAndVersion) {
  EXPECT_EQ(ManifestFromJson("{not json", "m.json").status().code(), StatusCode::kCorruption);
  std::string j = ManifestToJson(Sample());
  j.replace(j.find("\"format_version\": 1"), 19, "\"format_version\": 7");
  EXPECT_EQ(ManifestFromJson(j, "m.json").status().message(),
            "m.json: manifest format_version 7 is not supported (this build reads 1)");
  // Not integers, or out of int's range: refused, never converted (under
  // UBSan, 4.4e27 as int was manifest_fuzz's finding).
  for (const char* v : {"4444444444244444442444444488.8888889", "1.0", "-1", "9223372036854775808",
                        "18446744073709551615", "\"1\"", "true"}) {
    std::string k = ManifestToJson(Sample());
    k.replace(k.find("\"format_version\": 1"), 19, std::string("\"format_version\": ") + v);
    Status s = ManifestFromJson(k, "m.json").status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << v;
    EXPECT_NE(s.message().find("format_version"), std::string::npos) << s.ToString();
  }
  testing::ScratchDir dir;
  Status missing = LoadManifest(dir.path()).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(dir / "manifest.json"), std::string::npos) << missing.ToString();
}

TEST(Manifest, NamesThatAreNotUtf8RoundTripExactly) {
  Manifest m = Sample();
  m.classes = {"caf\xe9", "back\\slash", "\xc3\xa9t\xc3\xa9", "cut\xe2\x82", "\xed\xa0\x80"};
  m.source_path = "/data/\xff\xfe";
  m.splits["train"].skipped = {{"/data/\xff\xfe/caf\xe9/x\x80.png", "Corruption: /data/\xff: bad"}};
  m.splits["train"].source = "\\x41";  // looks like an escape: must survive as written
  std::string text;
  ASSERT_NO_THROW(text = ManifestToJson(m));
  EXPECT_NE(text.find("\"caf\\\\xE9\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"\xc3\xa9t\xc3\xa9\""), std::string::npos) << text;  // UTF-8 as is
  Result<Manifest> back = ManifestFromJson(text, "m.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->classes, m.classes);
  EXPECT_EQ(back->source_path, m.source_path);
  EXPECT_EQ(back->splits.at("train").skipped[0].path, m.splits["train"].skipped[0].path);
  EXPECT_EQ(back->splits.at("train").skipped[0].reason, m.splits["train"].skipped[0].reason);
  EXPECT_EQ(back->splits.at("train").source, "\\x41");
  // Through a file, too (SaveManifest must not throw either).
  testing::ScratchDir dir;
  ASSERT_TRUE(SaveManifest(dir.path(), m).ok());
  EXPECT_EQ(LoadManifest(dir.path())->classes, m.classes);
}

TEST(Manifest, EscapeIsLosslessForEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  EXPECT_EQ(UnescapeManifestString(EscapeManifestString(all)), all);
  EXPECT_EQ(EscapeManifestString("plain \xc3\xa9 name"), "plain \xc3\xa9 name");  // UTF-8 as is
  EXPECT_EQ(EscapeManifestString("a\\b\xe9"), "a\\\\b\\xE9");
  EXPECT_EQ(UnescapeManifestString("a\\\\b\\xE9\\xe9\\q\\x4"), "a\\b\xe9\xe9\\q\\x4");
}

// ---- hostile manifests: refused, naming the field and quoting the text ----

// The sample manifest's JSON with `from` replaced by `to` (first occurrence).
std::string Edited(const std::string& from, const std::string& to) {
  std::string j = ManifestToJson(Sample());
  const size_t at = j.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) j.replace(at, from.size(), to);
  return j;
}

TEST(Manifest, EmptyClassListRefused) {
  std::string j = ManifestToJson(Sample());
  const size_t a = j.find("\"classes\": [");
  const size_t b = j.find(']', a);
  j.replace(a, b - a + 1, "\"classes\": []");
  Status s = ManifestFromJson(j, "m.json").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(),
            "m.json: the manifest's class list is empty (labels could not be checked)");
}

TEST(Manifest, NegativeOrFractionalNumbersNamedNotWrapped) {
  struct Case {
    std::string from, to, want;
  };
  const Case cases[] = {
      {"\"count\": 3", "\"count\": -1",
       "m.json: split 'train' shard 0 field 'count' must be a non-negative integer, not -1"},
      {"\"bytes\": 4096", "\"bytes\": -4096",
       "m.json: split 'train' shard 1 field 'bytes' must be a non-negative integer, not -4096"},
      {"\"count\": 3", "\"count\": 2.5",
       "m.json: split 'train' shard 0 field 'count' must be a non-negative integer, not 2.5"},
      {"\"first_index\": 3", "\"first_index\": \"3\"",
       "m.json: split 'train' shard 1 field 'first_index' must be a non-negative integer, not "
       "\"3\""},
      {"\"num_samples\": 5", "\"num_samples\": -5",
       "m.json: split 'train' field 'num_samples' must be a non-negative integer, not -5"},
  };
  for (const Case& c : cases) {
    Status s = ManifestFromJson(Edited(c.from, c.to), "m.json").status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << c.to;
    EXPECT_EQ(s.message(), c.want);
    EXPECT_EQ(s.message().find("18446744073709551615"), std::string::npos);
  }
}

TEST(Manifest, CountsThatOverflowRefused) {
  Manifest m = Sample();
  m.splits["train"].shards[0].count = 1ull << 63;
  m.splits["train"].shards[1].first_index = 1ull << 63;
  m.splits["train"].shards[1].count = 1ull << 63;
  m.splits["train"].num_samples = 0;  // what 2^63 + 2^63 wraps to
  Status s = ManifestFromJson(ManifestToJson(m), "m.json").status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(),
            "m.json: split 'train' shard 1 count 9223372036854775808 overflows the index range");
}

TEST(Manifest, UnsafeShardPathsRefused) {
  for (const std::string& bad :
       {std::string(""), std::string("/etc"), std::string("train/../../x"), std::string(".."),
        std::string("train/./shard"), std::string("train//shard"), std::string("train\0/x", 8)}) {
    Manifest m = Sample();
    m.splits["train"].shards[0].path = bad;
    Status s = ManifestFromJson(ManifestToJson(m), "m.json").status();
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << bad;
    EXPECT_NE(s.message().find("m.json: split 'train' shard 0 has an unsafe path"),
              std::string::npos)
        << s.ToString();
  }
  Status nul = [] {
    Manifest m = Sample();
    m.splits["train"].shards[0].path = std::string("train\0/x", 8);
    return ManifestFromJson(ManifestToJson(m), "m.json").status();
  }();
  EXPECT_NE(nul.message().find("\"train\\u0000/x\""), std::string::npos) << nul.ToString();
  // Dots inside a name are fine.
  Manifest m = Sample();
  m.splits["train"].shards[0].path = "train/shard..v2";
  EXPECT_TRUE(ManifestFromJson(ManifestToJson(m), "m.json").ok());
}

}  // namespace
}  // namespace nl

#include "formats/cifar_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "formats/file_util.h"
#include "formats/test_util.h"

namespace nl {
namespace {

TEST(Cifar, FakeDatasetReadsBack) {
  testing::ScratchDir dir;
  ASSERT_TRUE(WriteFakeCifar100(dir.path(), {.train = 250, .test = 50, .seed = 3}).ok());
  Result<CifarFiles> f = ReadCifar100(dir.path());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->train.size(), 250 * kCifarRecordSize);
  EXPECT_EQ(f->test.size(), 50 * kCifarRecordSize);
  EXPECT_EQ(f->fine_names.size(), 100u);
  EXPECT_EQ(f->coarse_names[19], "superclass_19");
  auto src =
      CifarSplitSource::Create(f->train.span(), "train.bin", &f->fine_names, CifarLabel::kFine);
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)->size(), 250u);
  SourceSample s;
  ASSERT_TRUE((*src)->Load(123, &s).ok());
  EXPECT_EQ(s.label, 23u);
  ASSERT_TRUE(s.decoded);
  // Planar R, G, B in the file become interleaved RGB.
  const uint8_t* rec = f->train.data() + 123 * kCifarRecordSize;
  const size_t y = 5, x = 9, p = y * 32 + x;
  EXPECT_EQ(s.image.pixels[3 * p + 0], rec[2 + p]);
  EXPECT_EQ(s.image.pixels[3 * p + 1], rec[2 + 1024 + p]);
  EXPECT_EQ(s.image.pixels[3 * p + 2], rec[2 + 2048 + p]);
  auto coarse =
      CifarSplitSource::Create(f->train.span(), "train.bin", &f->coarse_names, CifarLabel::kCoarse);
  ASSERT_TRUE(coarse.ok());
  ASSERT_TRUE((*coarse)->Load(123, &s).ok());
  EXPECT_EQ(s.label, 23u / 5);
}

TEST(Cifar, FakeIsDeterministic) {
  testing::ScratchDir a, b;
  ASSERT_TRUE(WriteFakeCifar100(a.path(), {.train = 100, .test = 10, .seed = 9}).ok());
  ASSERT_TRUE(WriteFakeCifar100(b.path(), {.train = 100, .test = 10, .seed = 9}).ok());
  EXPECT_EQ(*ReadFileBytes(a / "train.bin"), *ReadFileBytes(b / "train.bin"));
}

TEST(Cifar, WrongSizeNamesTheOffset) {
  testing::ScratchDir dir;
  ASSERT_TRUE(WriteFakeCifar100(dir.path(), {.train = 3, .test = 2}).ok());
  std::vector<uint8_t> bin = *ReadFileBytes(dir / "train.bin");
  bin.push_back(0);
  testing::WriteBytes(dir / "train.bin", bin);
  Status s = ReadCifar100(dir.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(),
            dir.path() +
                "/train.bin is 9223 bytes, not a multiple of the 3074-byte record size: "
                "the record at byte offset 9222 (record 3) has only 1 bytes");
}

TEST(Cifar, MissingFileAndBadLabel) {
  testing::ScratchDir dir;
  ASSERT_TRUE(WriteFakeCifar100(dir.path(), {.train = 3, .test = 2}).ok());
  std::remove((dir / "test.bin").c_str());
  Status s = ReadCifar100(dir.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no test.bin"), std::string::npos);

  std::vector<uint8_t> bin(2 * kCifarRecordSize, 0);
  bin[kCifarRecordSize + 1] = 100;  // fine label of record 1
  std::vector<std::string> names(100, "n");
  Status bad = CifarSplitSource::Create(bin, "train.bin", &names, CifarLabel::kFine).status();
  EXPECT_EQ(bad.message(),
            "train.bin record 1 (byte offset 3074): fine label 100 out of range (100 classes)");
}

TEST(Cifar, ReadsTheTarballWithoutUnpacking) {
  testing::ScratchDir dir;
  const std::string src = dir / "cifar-100-binary";
  ASSERT_TRUE(WriteFakeCifar100(src, {.train = 20, .test = 5, .seed = 1}).ok());
  const std::string tgz = dir / "cifar-100-binary.tar.gz";
  const std::string cmd = "tar -C " + dir.path() + " -czf " + tgz + " cifar-100-binary";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  Result<CifarFiles> from_tar = ReadCifar100(tgz);
  ASSERT_TRUE(from_tar.ok()) << from_tar.status().ToString();
  Result<CifarFiles> from_dir = ReadCifar100(src);
  ASSERT_TRUE(from_dir.ok());
  EXPECT_TRUE(std::ranges::equal(from_tar->train.span(), from_dir->train.span()));
  EXPECT_TRUE(std::ranges::equal(from_tar->test.span(), from_dir->test.span()));
  EXPECT_EQ(from_tar->fine_names, from_dir->fine_names);

  testing::WriteText(dir / "broken.tar.gz", "not a tarball");
  EXPECT_FALSE(ReadCifar100(dir / "broken.tar.gz").ok());
}

}  // namespace
}  // namespace nl

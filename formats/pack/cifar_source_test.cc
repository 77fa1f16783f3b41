#include "formats/pack/cifar_source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "base/file_util.h"
#include "tests/support/test_util.h"

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
  Status broken = ReadCifar100(dir / "broken.tar.gz").status();
  EXPECT_EQ(broken.code(), StatusCode::kIOError) << broken.ToString();
  EXPECT_NE(broken.message().find("cannot open archive " + (dir / "broken.tar.gz")),
            std::string::npos)
      << broken.ToString();
}

// Found by cifar_fuzz: a gzip stream cut inside its header, for which
// libarchive has no error text (a null string); reading it crashed.
TEST(Cifar, ArchiveFailingWithoutAReasonIsAnErrorNotACrash) {
  testing::ScratchDir dir;
  const std::string tgz = dir / "cifar-100-binary.tar.gz";
  const unsigned char cut[] = {0x1f, 0x8b, 0x08, 0x00, 0x10, 0x6b, 0x17, 0x27,
                               0x09, 0x1d, 0x6b, 0xe0, 0x74, 0x00, 0x00};
  testing::WriteText(tgz, std::string(reinterpret_cast<const char*>(cut), sizeof cut));
  Status s = ReadCifar100(tgz).status();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(tgz), std::string::npos) << s.ToString();
}

// ---- hostile archives: bounded by what CIFAR-100 can be ----

// A ustar header for `name` declaring `size` bytes (base-256 when it does not
// fit in octal, as GNU tar writes it), with a valid checksum.
std::string TarHeader(const std::string& name, uint64_t size) {
  std::string h(512, '\0');
  h.replace(0, name.size(), name);
  h.replace(100, 7, "0000644");
  h.replace(108, 7, "0000000");
  h.replace(116, 7, "0000000");
  h[124] = static_cast<char>(0x80);  // base-256 size, big-endian in bytes 125..135
  for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xFF);
  h.replace(136, 11, "00000000000");
  h[156] = '0';
  h.replace(257, 6, std::string("ustar\0", 6));
  h.replace(263, 2, "00");
  h.replace(148, 8, "        ");
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  char chk[8];
  std::snprintf(chk, sizeof chk, "%06o", sum);
  h.replace(148, 7, std::string(chk, 6) + '\0');
  return h;
}

TEST(Cifar, MemberDeclaringHugeSizeRefusedBeforeAllocating) {
  testing::ScratchDir dir;
  const std::string tar = dir / "cifar-100-binary.tar";
  testing::WriteText(
      tar, TarHeader("cifar-100-binary/train.bin", uint64_t{1} << 62) + std::string(4096, 'x'));
  Result<CifarFiles> r = ReadCifar100(tar);
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_EQ(r.status().message(), "archive " + tar +
                                      ", member cifar-100-binary/train.bin declares "
                                      "4611686018427387904 bytes; CIFAR-100's train.bin is at "
                                      "most 153700000");
}

TEST(Cifar, CompressedBombRefusedFromItsDeclaredSize) {
  testing::ScratchDir dir;
  const std::string src = dir / "cifar-100-binary";
  ASSERT_TRUE(WriteFakeCifar100(src, {.train = 2, .test = 2}).ok());
  // 2 MiB of zeros as a name file: a few KiB once gzipped.
  testing::WriteText(src + "/fine_label_names.txt", std::string(2 << 20, '\0'));
  const std::string tgz = dir / "bomb.tar.gz";
  ASSERT_EQ(std::system(("tar -C " + dir.path() + " -czf " + tgz + " cifar-100-binary").c_str()),
            0);
  Result<CifarFiles> r = ReadCifar100(tgz);
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find("member cifar-100-binary/fine_label_names.txt declares "
                                      "2097152 bytes; CIFAR-100's fine_label_names.txt is at "
                                      "most 65536"),
            std::string::npos)
      << r.status().ToString();
}

TEST(Cifar, FakeCountsAreBounded) {
  testing::ScratchDir dir;
  Status s = WriteFakeCifar100(dir / "x", {.train = kMaxFakeCifarImages + 1, .test = 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 1000000 each"), std::string::npos) << s.ToString();
  s = WriteFakeCifar100(dir / "x", {.train = ~uint64_t{0}, .test = 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

}  // namespace
}  // namespace nl

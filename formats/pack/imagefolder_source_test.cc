#include "formats/pack/imagefolder_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "base/file_util.h"
#include "tests/support/test_util.h"

namespace nl {
namespace {

void Touch(const std::string& p) { testing::WriteText(p, "x"); }

TEST(ImageFolder, TorchvisionOrderAndLabels) {
  testing::ScratchDir d;
  for (const char* c : {"zebra", "Apple", "cat", "cat/sub", "cat/sub/deeper", "cat/a_dir"}) {
    ASSERT_TRUE(MakeDirs(d / c).ok());
  }
  Touch(d / "zebra/1.png");
  Touch(d / "Apple/b.JPG");  // extension match is case-insensitive
  Touch(d / "Apple/a.jpeg");
  Touch(d / "Apple/notes.txt");  // not an image extension: ignored
  Touch(d / "cat/z.png");
  Touch(d / "cat/sub/a.png");
  Touch(d / "cat/sub/deeper/0.webp");
  Touch(d / "cat/a_dir/m.bmp");
  Touch(d / "cat/y.tiff");
  Touch(d / "loose_file.png");  // not in a class directory: ignored
  auto src = ImageFolderSource::Scan(d.path());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->classes(), (std::vector<std::string>{"Apple", "cat", "zebra"}));
  // sorted(os.walk(class_dir)): directories by path, files by name within each.
  std::vector<std::string> want = {
      "Apple/a.jpeg",  "Apple/b.JPG",           "cat/y.tiff", "cat/z.png", "cat/a_dir/m.bmp",
      "cat/sub/a.png", "cat/sub/deeper/0.webp", "zebra/1.png"};
  std::vector<uint32_t> labels = {0, 0, 1, 1, 1, 1, 1, 2};
  ASSERT_EQ((*src)->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*src)->path(i), d / want[i]) << i;
    EXPECT_EQ((*src)->label(i), labels[i]) << i;
  }
}

TEST(ImageFolder, SymlinksFollowedLoopsDetected) {
  testing::ScratchDir d;
  ASSERT_TRUE(MakeDirs(d / "elsewhere/inner").ok());
  ASSERT_TRUE(MakeDirs(d / "root/a").ok());
  Touch(d / "elsewhere/inner/x.png");
  ASSERT_EQ(::symlink((d / "elsewhere").c_str(), (d / "root/b").c_str()), 0);  // class via link
  Touch(d / "root/a/1.png");
  auto src = ImageFolderSource::Scan(d / "root");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ((*src)->classes(), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ((*src)->size(), 2u);
  EXPECT_EQ((*src)->path(1), d / "root/b/inner/x.png");

  ASSERT_EQ(::symlink("..", (d / "elsewhere/inner/up").c_str()), 0);  // a loop
  Status s = ImageFolderSource::Scan(d / "root").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("symlink loop: " + (d / "root/b/inner/up")), std::string::npos)
      << s.ToString();
}

TEST(ImageFolder, EmptyClassAndNoClassesAreErrors) {
  testing::ScratchDir d;
  Status none = ImageFolderSource::Scan(d.path()).status();
  EXPECT_EQ(none.code(), StatusCode::kNotFound);
  EXPECT_NE(none.message().find("no class directories in " + d.path()), std::string::npos)
      << none.ToString();
  ASSERT_TRUE(MakeDirs(d / "a").ok());
  ASSERT_TRUE(MakeDirs(d / "b").ok());
  Touch(d / "a/1.png");
  Touch(d / "b/readme.md");
  Status s = ImageFolderSource::Scan(d.path()).status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(d / "b has no image files"), std::string::npos) << s.ToString();
  EXPECT_EQ(ImageFolderSource::Scan(d / "missing").status().code(), StatusCode::kNotFound);
}

TEST(ImageFolder, ExtensionFilter) {
  for (const char* yes :
       {"a.jpg", "a.JPEG", "b.png", "c.ppm", "d.bmp", "e.pgm", "f.tif", "g.TIFF", "h.webp"}) {
    EXPECT_TRUE(HasImageExtension(yes)) << yes;
  }
  for (const char* no : {"a.gif", "b.txt", "png", "c.png.bak", "d.jp"})
    EXPECT_FALSE(HasImageExtension(no)) << no;
}

}  // namespace
}  // namespace nl

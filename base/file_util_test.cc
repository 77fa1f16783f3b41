// Tests of base/file_util.h: reading and writing whole files, directories,
// the lock file, canonical paths, mapped bytes and TempDir.
#include "base/file_util.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/test_util.h"

namespace nl {
namespace {

using testing::ScratchDir;
using testing::WriteText;
namespace fs = std::filesystem;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(FileUtil, ReadsWholeFiles) {
  ScratchDir d;
  const std::string text = std::string("abc\0def", 7) + std::string(10000, 'x');
  WriteText(d / "f", text);
  Result<std::string> s = ReadFileToString(d / "f");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, text);
  Result<std::vector<uint8_t>> b = ReadFileBytes(d / "f");
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(std::string(b->begin(), b->end()), text);

  // ReadFileInto appends to what is there.
  std::vector<uint8_t> out = {'<', '>'};
  ASSERT_TRUE(ReadFileInto(d / "f", &out).ok());
  ASSERT_EQ(out.size(), 2 + text.size());
  EXPECT_EQ(std::string(out.begin() + 2, out.end()), text);
  EXPECT_EQ(out[0], '<');
}

TEST(FileUtil, ReadsAnEmptyFileAsEmpty) {
  ScratchDir d;
  WriteText(d / "empty", "");
  Result<std::string> s = ReadFileToString(d / "empty");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->empty());
  std::vector<uint8_t> out = {1, 2, 3};
  ASSERT_TRUE(ReadFileInto(d / "empty", &out).ok());
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 2, 3}));
}

TEST(FileUtil, MissingFileIsNotFoundNamingThePath) {
  ScratchDir d;
  const std::string missing = d / "no-such-file";
  Result<std::string> s = ReadFileToString(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.status().message(), missing)) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), "No such file")) << s.status().ToString();

  Result<std::vector<uint8_t>> b = ReadFileBytes(missing);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(b.status().message(), missing)) << b.status().ToString();

  std::vector<uint8_t> out = {7};
  Status st = ReadFileInto(missing, &out);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(st.message(), missing)) << st.ToString();
  EXPECT_EQ(out, std::vector<uint8_t>{7});  // left as it was
}

TEST(FileUtil, ReadingADirectoryIsAnErrorNamingIt) {
  ScratchDir d;
  const std::string dir = d / "sub";
  ASSERT_TRUE(MakeDirs(dir).ok());
  Result<std::string> s = ReadFileToString(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(s.status().message(), dir)) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), "is a directory")) << s.status().ToString();
}

TEST(FileUtil, AFifoOrADeviceIsRefusedWithoutWaiting) {
  // Opening a FIFO for reading waits for a writer: a FIFO named like an
  // image hung the packer for good.
  ScratchDir d;
  const std::string fifo = d / "pipe.jpg";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& p : {fifo, std::string("/dev/zero")}) {
    std::vector<uint8_t> out;
    Status s = ReadFileInto(p, &out);
    EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), p + ": it is a")) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "not a regular file")) << s.ToString();
  }
  EXPECT_FALSE(FileBytes::Map(fifo).ok());
}

TEST(FileUtil, AFileOverTheReadersLimitIsRefusedBeforeAllocating) {
  ScratchDir d;
  WriteText(d / "big", std::string(1000, 'x'));
  Result<std::string> s = ReadFileToString(d / "big", 999);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.status().message(), "1000 bytes, more than the 999")) << s.status().ToString();
  EXPECT_EQ(ReadFileToString(d / "big", 1000)->size(), 1000u);
}

TEST(FileUtil, WhatIsCreatedIsTheUsersOnly) {
  ScratchDir d;
  const mode_t old = ::umask(022);
  ASSERT_TRUE(MakeDirs(d / "a/b/c").ok());
  ASSERT_TRUE(WriteFile(d / "a/f", "x", 1).ok());
  ASSERT_TRUE(WriteFileAtomically(d / "a/g", "y").ok());
  ASSERT_TRUE(CreatePrivateFile(d / "a/h").ok());
  ::umask(old);
  auto mode = [](const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 0777;
  };
  for (const char* p : {"a", "a/b", "a/b/c"}) EXPECT_EQ(mode(d / p), 0700u) << p;
  for (const char* p : {"a/f", "a/g", "a/h"}) EXPECT_EQ(mode(d / p), 0600u) << p;
  // A file its owner opened to others stays open when replaced.
  ASSERT_EQ(::chmod((d / "a/g").c_str(), 0644), 0);
  ASSERT_TRUE(WriteFileAtomically(d / "a/g", "z").ok());
  EXPECT_EQ(mode(d / "a/g"), 0644u);
  // An existing directory keeps its mode; a file in the way is an error.
  ASSERT_EQ(::chmod((d / "a").c_str(), 0755), 0);
  ASSERT_TRUE(MakeDirs(d / "a/b").ok());
  EXPECT_EQ(mode(d / "a"), 0755u);
  EXPECT_FALSE(MakeDirs(d / "a/f/x").ok());
}

TEST(FileUtil, WriteFileWritesAndTruncates) {
  ScratchDir d;
  const std::string long_text(5000, 'a');
  ASSERT_TRUE(WriteFile(d / "f", long_text.data(), long_text.size()).ok());
  EXPECT_EQ(*ReadFileToString(d / "f"), long_text);
  ASSERT_TRUE(WriteFile(d / "f", "xy", 2).ok());
  EXPECT_EQ(*ReadFileToString(d / "f"), "xy");
  ASSERT_TRUE(WriteFile(d / "empty", "", 0).ok());
  EXPECT_EQ(*FileSize(d / "empty"), 0u);
}

TEST(FileUtil, WriteFileIntoAMissingDirectoryNamesTheTarget) {
  ScratchDir d;
  const std::string target = d / "no-dir/f";
  Status s = WriteFile(target, "x", 1);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "cannot create " + target)) << s.ToString();
}

TEST(FileUtil, WriteFileAtomicallyReplacesAndLeavesNoTemp) {
  ScratchDir d;
  const std::string target = d / "manifest.json";
  ASSERT_TRUE(WriteFileAtomically(target, "first").ok());
  EXPECT_EQ(*ReadFileToString(target), "first");
  ASSERT_TRUE(WriteFileAtomically(target, "second, longer").ok());
  EXPECT_EQ(*ReadFileToString(target), "second, longer");
  ASSERT_TRUE(WriteFileAtomically(target, "").ok());
  EXPECT_EQ(*ReadFileToString(target), "");
  EXPECT_EQ(Listing(d.path()), std::vector<std::string>{"manifest.json"});
}

TEST(FileUtil, WriteFileAtomicallyIntoAMissingDirectoryNamesTheTarget) {
  ScratchDir d;
  const std::string target = d / "no-dir/manifest.json";
  Status s = WriteFileAtomically(target, "x");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), target)) << s.ToString();
  EXPECT_TRUE(Listing(d.path()).empty());
}

TEST(FileUtil, WriteFileAtomicallyRefusesToReplaceWhatIsNotAFile) {
  ScratchDir d;
  const std::string fifo = d / "chart.svg";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Status s = WriteFileAtomically(fifo, "x");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "will not replace " + fifo +
                             ": it is not a regular file (a device, FIFO, socket or directory)");
  ASSERT_TRUE(MakeDirs(d / "dir").ok());
  EXPECT_EQ(WriteFileAtomically(d / "dir", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"chart.svg", "dir"}));  // no temporary left
}

TEST(FileUtil, WriteFileAtomicallyReplacesTheFileALinkPointsTo) {
  ScratchDir d;
  WriteText(d / "real.json", "old");
  ASSERT_EQ(::symlink("real.json", (d / "link.json").c_str()), 0);
  ASSERT_TRUE(WriteFileAtomically(d / "link.json", "new").ok());
  EXPECT_EQ(*ReadFileToString(d / "link.json"), "new");
}

TEST(FileUtil, TemporariesHaveOneNamingAndOneRemover) {
  ScratchDir d;
  const std::string t = TemporaryPath(d / "checkpoint.pt");
  EXPECT_EQ(t, d / "checkpoint.pt.tmp-" + std::to_string(::getpid()));
  EXPECT_EQ(TemporaryBaseName("checkpoint.pt.tmp-4242"), "checkpoint.pt");
  EXPECT_EQ(TemporaryBaseName("out.tmp-12"), "out");
  EXPECT_EQ(TemporaryBaseName("out.tmp-"), "");
  EXPECT_EQ(TemporaryBaseName("out.tmp-12x"), "");
  EXPECT_EQ(TemporaryBaseName(".tmp-12"), "");
  EXPECT_EQ(TemporaryBaseName("checkpoint.pt"), "");
  WriteText(d / "checkpoint.pt.tmp-4242", "half");
  WriteText(d / "notes.txt.tmp-7", "someone else's");
  ASSERT_TRUE(MakeDirs(d / "out.tmp-99/train").ok());
  WriteText(d / "checkpoint.pt", "kept");
  const std::vector<std::string> removed = RemoveStaleTemporaries(
      d.path(), [](const std::string&, const std::string& base) { return base != "notes.txt"; });
  EXPECT_EQ(removed.size(), 2u);
  EXPECT_EQ(Listing(d.path()), (std::vector<std::string>{"checkpoint.pt", "notes.txt.tmp-7"}));
  EXPECT_TRUE(RemoveStaleTemporaries(d / "missing", [](auto&, auto&) { return true; }).empty());
}

TEST(FileUtil, MakeDirsNestedAndExisting) {
  ScratchDir d;
  const std::string nested = d / "a/b/c";
  ASSERT_TRUE(MakeDirs(nested).ok());
  EXPECT_TRUE(fs::is_directory(nested));
  EXPECT_TRUE(MakeDirs(nested).ok());  // already there: fine
  EXPECT_TRUE(MakeDirs(d.path()).ok());
}

TEST(FileUtil, MakeDirsWithAFileInTheWayNamesIt) {
  ScratchDir d;
  WriteText(d / "file", "x");
  const std::string under = d / "file/sub";
  Status s = MakeDirs(under);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(s.message(), "cannot create directory " + under)) << s.ToString();
  Status same = MakeDirs(d / "file");
  EXPECT_EQ(same.code(), StatusCode::kIOError);
  EXPECT_TRUE(Contains(same.message(), d / "file")) << same.ToString();
}

TEST(FileUtil, RemoveAllTreesAndMissingPaths) {
  ScratchDir d;
  ASSERT_TRUE(MakeDirs(d / "t/u").ok());
  WriteText(d / "t/u/f", "x");
  WriteText(d / "t/g", "y");
  ASSERT_TRUE(RemoveAll(d / "t").ok());
  EXPECT_FALSE(PathExists(d / "t"));
  EXPECT_TRUE(RemoveAll(d / "t").ok());  // missing: fine
  EXPECT_TRUE(RemoveAll(d / "never/was").ok());
}

TEST(FileUtil, FileSizeAndMissingFile) {
  ScratchDir d;
  WriteText(d / "f", std::string(1234, 'z'));
  Result<uint64_t> n = FileSize(d / "f");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1234u);
  Result<uint64_t> missing = FileSize(d / "gone");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status().message(), d / "gone")) << missing.status().ToString();
  EXPECT_TRUE(PathExists(d / "f"));
  EXPECT_FALSE(PathExists(d / "gone"));
}

TEST(FileBytes, MapsContentEmptyFilesAndMoves) {
  ScratchDir d;
  const std::string text = "mapped bytes";
  WriteText(d / "f", text);
  Result<FileBytes> m = FileBytes::Map(d / "f");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), text.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->data()), m->size()), text);

  FileBytes moved = std::move(*m);
  EXPECT_EQ(moved.size(), text.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(moved.data()), moved.size()), text);
  EXPECT_EQ(m->size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty

  FileBytes assigned = FileBytes::Own({1, 2});
  assigned = std::move(moved);
  EXPECT_EQ(assigned.span().size(), text.size());
  EXPECT_EQ(assigned.span()[0], 'm');

  WriteText(d / "empty", "");
  Result<FileBytes> e = FileBytes::Map(d / "empty");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->size(), 0u);

  FileBytes owned = FileBytes::Own({9, 8, 7});
  EXPECT_EQ(owned.size(), 3u);
  EXPECT_EQ(owned.data()[2], 7);
}

TEST(FileBytes, MapOfAMissingFileNamesIt) {
  ScratchDir d;
  Result<FileBytes> m = FileBytes::Map(d / "gone");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(m.status().message(), "cannot open " + (d / "gone")))
      << m.status().ToString();
}

TEST(TempDir, RemovedOnDestructionKeptAfterRelease) {
  ScratchDir d;
  const std::string a = d / "a", b = d / "b", c = d / "c";
  ASSERT_TRUE(MakeDirs(a + "/x").ok());
  WriteText(a + "/x/f", "1");
  { TempDir t(a); }
  EXPECT_FALSE(PathExists(a));

  ASSERT_TRUE(MakeDirs(b).ok());
  {
    TempDir t(b);
    t.Release();
    EXPECT_TRUE(t.path().empty());
  }
  EXPECT_TRUE(PathExists(b));

  // Moving hands over ownership: only the last owner removes it.
  ASSERT_TRUE(MakeDirs(c).ok());
  {
    TempDir outer;
    {
      TempDir inner(c);
      outer = std::move(inner);
    }
    EXPECT_TRUE(PathExists(c));
    EXPECT_EQ(outer.path(), c);
  }
  EXPECT_FALSE(PathExists(c));
}

TEST(CanonicalPath, ResolvesSymlinksAndMissingTails) {
  ScratchDir d;
  Result<std::string> root = CanonicalPath(d.path());
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  ASSERT_TRUE(MakeDirs(d / "real/sub").ok());
  fs::create_directory_symlink(d / "real", d / "link");

  Result<std::string> via_link = CanonicalPath(d / "link/sub");
  ASSERT_TRUE(via_link.ok());
  EXPECT_EQ(*via_link, *root + "/real/sub");
  Result<std::string> missing_tail = CanonicalPath(d / "link/not/yet/there");
  ASSERT_TRUE(missing_tail.ok());
  EXPECT_EQ(*missing_tail, *root + "/real/not/yet/there");
  Result<std::string> dots = CanonicalPath(d / "real/sub/../sub/./");
  ASSERT_TRUE(dots.ok());
  EXPECT_EQ(*dots, *root + "/real/sub");
}

TEST(CanonicalPath, PathIsWithinComparesWholeComponents) {
  EXPECT_TRUE(PathIsWithin("/data/out", "/data/out"));
  EXPECT_TRUE(PathIsWithin("/data/out/train", "/data/out"));
  EXPECT_TRUE(PathIsWithin("/data/out/train", "/data/out/"));
  EXPECT_FALSE(PathIsWithin("/data/output", "/data/out"));
  EXPECT_FALSE(PathIsWithin("/data", "/data/out"));
  EXPECT_FALSE(PathIsWithin("/other/out", "/data/out"));
  EXPECT_TRUE(PathIsWithin("/anything", "/"));
}

TEST(FileLock, SecondHolderIsRefusedUntilTheFirstLetsGo) {
  ScratchDir d;
  const std::string path = d / "out.lock";
  Result<FileLock> first = FileLock::Acquire(path, nullptr, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->path(), path);
  EXPECT_TRUE(PathExists(path));

  // TryAcquire opens its own file description: refused while held.
  Result<std::optional<FileLock>> second = FileLock::TryAcquire(path);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->has_value());

  // Acquire waits: it tells on_wait once; a set cancel flag ends the wait.
  std::atomic<bool> cancel{true};
  int waits = 0;
  Result<FileLock> cancelled = FileLock::Acquire(
      path, [&] { ++waits; }, &cancel);
  ASSERT_FALSE(cancelled.ok());
  EXPECT_EQ(cancelled.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(cancelled.status().message(), "waiting for the lock " + path))
      << cancelled.status().ToString();
  EXPECT_EQ(waits, 1);

  // Released on destruction (the holder unlinks the file): free again.
  { FileLock gone = std::move(*first); }
  EXPECT_FALSE(PathExists(path));
  Result<std::optional<FileLock>> third = FileLock::TryAcquire(path);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  ASSERT_TRUE(third->has_value());
  (*third)->Release();
  EXPECT_FALSE(PathExists(path));
}

TEST(FileLock, AcquireWaitsForTheHolderThenGetsIt) {
  ScratchDir d;
  const std::string path = d / "out.lock";
  Result<FileLock> first = FileLock::Acquire(path, nullptr, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  // The holder lets go while the second one waits (from its on_wait call);
  // the waiter then takes the lock.
  int waits = 0;
  Result<FileLock> second = FileLock::Acquire(
      path,
      [&] {
        ++waits;
        first->Release();
      },
      nullptr);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(waits, 1);
  EXPECT_TRUE(PathExists(path));
  Result<std::optional<FileLock>> third = FileLock::TryAcquire(path);
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->has_value());
}

TEST(FileLock, ALockInAMissingDirectoryNamesTheFile) {
  ScratchDir d;
  const std::string path = d / "no-dir/out.lock";
  Result<std::optional<FileLock>> l = FileLock::TryAcquire(path);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(l.status().message(), "cannot open lock file " + path))
      << l.status().ToString();
}

}  // namespace
}  // namespace nl

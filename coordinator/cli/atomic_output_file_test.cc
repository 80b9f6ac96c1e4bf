#include "coordinator/cli/atomic_output_file.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class AtomicOutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkdir(dir_.c_str(), 0755);
  }

  std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::vector<std::string> Entries() {
    std::vector<std::string> names;
    DIR* d = opendir(dir_.c_str());
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
    return names;
  }

  std::string dir_;
};

TEST_F(AtomicOutputFileTest, CommitReplacesTheFileAndKeepsItsMode) {
  const std::string path = dir_ + "/out.jsonl";
  std::ofstream(path) << "old\n";
  chmod(path.c_str(), 0640);
  auto file = AtomicOutputFile::Create(path);
  ASSERT_TRUE(file.ok()) << file.status();
  (*file)->Write("new 1\n");
  EXPECT_EQ(Read(path), "old\n");  // nothing visible before Commit
  (*file)->Write("new 2\n");
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_EQ(Read(path), "new 1\nnew 2\n");
  struct stat info;
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0640u);
  file->reset();
  EXPECT_THAT(Entries(), ElementsAre("out.jsonl"));
}

TEST_F(AtomicOutputFileTest, DroppedWithoutCommitLeavesTheOldBytesAndNoTemporary) {
  const std::string path = dir_ + "/out.jsonl";
  std::ofstream(path) << "old line\n";
  {
    auto file = AtomicOutputFile::Create(path);
    ASSERT_TRUE(file.ok()) << file.status();
    (*file)->Write("half of something");
  }
  EXPECT_EQ(Read(path), "old line\n");
  EXPECT_THAT(Entries(), ElementsAre("out.jsonl"));
}

TEST_F(AtomicOutputFileTest, NewFileAppearsOnlyOnCommit) {
  const std::string path = dir_ + "/new.jsonl";
  {
    auto file = AtomicOutputFile::Create(path);
    ASSERT_TRUE(file.ok()) << file.status();
  }
  EXPECT_TRUE(Entries().empty());
  auto file = AtomicOutputFile::Create(path);
  ASSERT_TRUE(file.ok()) << file.status();
  (*file)->Write("x\n");
  ASSERT_TRUE((*file)->Commit().ok());
  EXPECT_EQ(Read(path), "x\n");
}

TEST_F(AtomicOutputFileTest, WritesThroughASymlink) {
  const std::string real = dir_ + "/real.jsonl";
  const std::string link = dir_ + "/link.jsonl";
  std::ofstream(real) << "old\n";
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  auto file = AtomicOutputFile::Create(link);
  ASSERT_TRUE(file.ok()) << file.status();
  (*file)->Write("new\n");
  ASSERT_TRUE((*file)->Commit().ok());
  struct stat info;
  ASSERT_EQ(lstat(link.c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode));
  EXPECT_EQ(Read(real), "new\n");
}

TEST_F(AtomicOutputFileTest, MissingDirectoryOrADirectoryIsAClearError) {
  auto file = AtomicOutputFile::Create(dir_ + "/no/such/dir/out.jsonl");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()),
              HasSubstr("cannot write '" + dir_ + "/no/such/dir/out.jsonl'"));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("No such file or directory"));
  file = AtomicOutputFile::Create(dir_);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("is a directory"));
}

}  // namespace
}  // namespace deepinfer

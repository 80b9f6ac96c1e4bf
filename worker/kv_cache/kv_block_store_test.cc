// Tests for KvBlockStore: host hits and bounds, spilling to disk, a new store on the same
// directory (a worker restart), stale / corrupt / other-model files as misses, the disk bound,
// and a directory that cannot be used.
#include "worker/kv_cache/kv_block_store.h"

#include <filesystem>
#include <fstream>
#include <numeric>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kRoot = 0x1234;
const char kKey[] = "model=a;block=4";

std::vector<int32_t> Tokens(int32_t from) { return {from, from + 1, from + 2, from + 3}; }

std::string Payload(char c, size_t n = 256) {
  std::string p(n, c);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(c + i % 7);
  return p;
}

class KvBlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        (std::string("kvstore_") + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }

  // Looks block (hash, tokens from `from`) up; the payload or "" on a miss.
  static std::string Get(KvBlockStore& s, uint64_t hash, int32_t from, uint64_t parent = 0,
                         const std::string& key = kKey, size_t bytes = 256) {
    std::string out;
    const std::vector<int32_t> t = Tokens(from);
    if (!s.Lookup(key, kRoot, hash, parent, t.data(), 4, bytes, &out)) return "";
    return out;
  }

  int FileCount() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().extension() == ".kvb";
    return n;
  }

  fs::path dir_;
};

TEST_F(KvBlockStoreTest, HostHitsOnlyTheSameBlock) {
  KvBlockStore s({1 << 20, "", 0});
  s.Put(kKey, kRoot, 7, 0, Tokens(10), Payload('a'));
  EXPECT_EQ(Get(s, 7, 10), Payload('a'));
  EXPECT_EQ(Get(s, 8, 10), "");                        // another hash
  EXPECT_EQ(Get(s, 7, 11), "");                        // other tokens
  EXPECT_EQ(Get(s, 7, 10, /*parent=*/3), "");          // another parent
  EXPECT_EQ(Get(s, 7, 10, 0, "model=b;block=4"), "");  // another key
  EXPECT_EQ(Get(s, 7, 10, 0, kKey, 128), "");          // another layout's size
  EXPECT_EQ(s.stats().host_hits, 1);
  EXPECT_EQ(s.stats().misses, 5);
}

TEST_F(KvBlockStoreTest, HostBoundDropsLeastRecentlyUsedWithoutDisk) {
  // Room for two entries of 256 bytes (plus their bookkeeping), not three.
  KvBlockStore s({2 * 500, "", 0});
  s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
  s.Put(kKey, kRoot, 2, 0, Tokens(0), Payload('b'));
  EXPECT_EQ(Get(s, 1, 0), Payload('a'));  // 1 is now the most recent
  s.Put(kKey, kRoot, 3, 0, Tokens(0), Payload('c'));
  EXPECT_EQ(Get(s, 2, 0), "");
  EXPECT_EQ(Get(s, 1, 0), Payload('a'));
  EXPECT_EQ(Get(s, 3, 0), Payload('c'));
  EXPECT_LE(s.host_bytes_used(), 1000);
}

TEST_F(KvBlockStoreTest, HostOverflowGoesToDiskAndARestartFindsFlushedBlocks) {
  {
    KvBlockStore s({500, dir_.string(), 1 << 20});
    ASSERT_TRUE(s.disk_enabled());
    s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
    s.Put(kKey, kRoot, 2, 1, Tokens(4), Payload('b'));  // pushes 1 to disk
    EXPECT_EQ(s.stats().disk_writes, 1);
    EXPECT_EQ(Get(s, 1, 0), Payload('a'));
    EXPECT_EQ(s.stats().disk_hits, 1);
  }  // destruction flushes 2
  EXPECT_EQ(FileCount(), 2);
  KvBlockStore again({500, dir_.string(), 1 << 20});
  EXPECT_EQ(Get(again, 2, 4, 1), Payload('b'));
  EXPECT_EQ(Get(again, 1, 0), Payload('a'));
  EXPECT_EQ(again.stats().disk_hits, 2);
  EXPECT_EQ(Get(again, 2, 5, 1), "");  // asked with other tokens: a stale file, removed
  EXPECT_EQ(again.stats().rejected, 1);
  EXPECT_EQ(FileCount(), 1);
}

TEST_F(KvBlockStoreTest, CorruptTruncatedAndOtherModelFilesAreMissesAndRemoved) {
  {
    KvBlockStore s({0, dir_.string(), 1 << 20});
    s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
    s.Put(kKey, kRoot, 2, 0, Tokens(0), Payload('b'));
    s.Put(kKey, kRoot, 3, 0, Tokens(0), Payload('c'));
    EXPECT_EQ(FileCount(), 3);
  }
  // Flip one byte of 1's payload; cut 2 short.
  const fs::path one = dir_ / KvBlockStore::FileName(kRoot, 1);
  {
    std::fstream f(one, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-10, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    f.seekp(-10, std::ios::end);
    c ^= 0x01;
    f.write(&c, 1);
  }
  const fs::path two = dir_ / KvBlockStore::FileName(kRoot, 2);
  fs::resize_file(two, fs::file_size(two) - 1);
  KvBlockStore s({0, dir_.string(), 1 << 20});
  EXPECT_EQ(Get(s, 1, 0), "");
  EXPECT_EQ(Get(s, 2, 0), "");
  EXPECT_EQ(Get(s, 3, 0, 0, "model=b;block=4"), "");  // same name, another model's key
  EXPECT_EQ(s.stats().rejected, 3);
  EXPECT_EQ(FileCount(), 0);
}

TEST_F(KvBlockStoreTest, DiskBoundRemovesLeastRecentlyUsedFiles) {
  KvBlockStore probe({0, dir_.string(), 1 << 20});
  probe.Put(kKey, kRoot, 99, 0, Tokens(0), Payload('z'));
  const int64_t file = probe.disk_bytes_used();
  ASSERT_GT(file, 256);
  fs::remove_all(dir_);

  KvBlockStore s({0, dir_.string(), 2 * file + file / 2});
  s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
  s.Put(kKey, kRoot, 2, 0, Tokens(0), Payload('b'));
  EXPECT_EQ(Get(s, 1, 0), Payload('a'));  // 2 is now the least recent
  s.Put(kKey, kRoot, 3, 0, Tokens(0), Payload('c'));
  EXPECT_EQ(s.stats().disk_evictions, 1);
  EXPECT_EQ(FileCount(), 2);
  EXPECT_LE(s.disk_bytes_used(), 2 * file + file / 2);
  EXPECT_EQ(Get(s, 2, 0), "");
  EXPECT_EQ(Get(s, 1, 0), Payload('a'));
  EXPECT_EQ(Get(s, 3, 0), Payload('c'));
}

TEST_F(KvBlockStoreTest, UnusableDirectoryTurnsTheDiskTierOffAndHostGoesOn) {
  fs::create_directories(dir_);
  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "x";
  KvBlockStore s({1 << 20, (file / "sub").string(), 1 << 20});
  EXPECT_FALSE(s.disk_enabled());
  s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
  EXPECT_EQ(Get(s, 1, 0), Payload('a'));
  s.Flush();
  EXPECT_EQ(s.stats().disk_writes, 0);
}

TEST_F(KvBlockStoreTest, ADirectoryThatStopsTakingWritesTurnsTheDiskTierOff) {
  KvBlockStore s({0, dir_.string(), 1 << 20});
  ASSERT_TRUE(s.disk_enabled());
  // The directory goes away under the store: the next write fails.
  fs::remove_all(dir_);
  s.Put(kKey, kRoot, 1, 0, Tokens(0), Payload('a'));
  EXPECT_FALSE(s.disk_enabled());
  EXPECT_EQ(Get(s, 1, 0), "");
  s.Put(kKey, kRoot, 2, 0, Tokens(0), Payload('b'));  // nothing tried, nothing fails
  EXPECT_EQ(s.stats().disk_writes, 0);
}

}  // namespace
}  // namespace deepinfer

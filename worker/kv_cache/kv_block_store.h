// KvBlockStore: the lower tiers of the prefix cache (docs/kv-cache.md). Cached blocks evicted
// from a rank's device pool (PrefixCache) are kept here, in host memory (a bounded LRU) and,
// with a directory, on local disk, so that a later request with the same prefix, or a worker
// started later on the same directory, copies them back instead of recomputing them.
//
//   device pool --evicted (or the cache is destroyed)--> host LRU --evicted, or Flush--> disk
//   Lookup: host, then disk; the caller copies the payload into a device block (where it is
//   cached again, and comes back here when evicted)
//
// An entry is what identifies a cached block in the device cache (the cache key, the chain hash
// of the block, its parent's hash, its tokens) and its payload (KvBlockPool::ReadBlock). Disk
// files hold all of that and a checksum of the payload; a lookup returns a block only when the
// key, hashes, tokens, payload size and checksum all match what it asks for, so a stale,
// truncated or corrupt file, or one of another model, is a miss (and the file is removed).
// Files live in one directory, named by the key's root hash and the block's chain hash; the
// directory is bounded (least recently used first, by an index built from the files' mtimes at
// start and kept since; a hit touches the file). A directory that cannot be created or written
// (disk full, read-only) turns the disk tier off with one log line; serving goes on without it.
//
// One store per worker, shared by its ranks (they use the same key); thread-safe.
#ifndef DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_STORE_H_
#define DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_STORE_H_

#include <cstdint>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer {

struct KvBlockStoreOptions {
  // Host memory for evicted blocks' payloads; 0: no host tier (blocks go straight to disk, or
  // are dropped).
  int64_t host_bytes = 0;
  // Local directory of the disk tier; empty: none.
  std::string dir;
  // Bound on the files in `dir` (all keys together).
  int64_t dir_bytes = 0;
};

struct KvBlockStoreStats {
  int64_t puts = 0;            // blocks handed to the store
  int64_t host_hits = 0;       // lookups served from host memory
  int64_t disk_hits = 0;       // lookups served from disk
  int64_t misses = 0;          // lookups that found nothing usable
  int64_t disk_writes = 0;     // block files written
  int64_t disk_evictions = 0;  // block files removed for room
  int64_t rejected = 0;        // block files found stale or corrupt (and removed)
};

class KvBlockStore {
 public:
  // Creates the directory when set; when that fails the disk tier is off (logged).
  explicit KvBlockStore(KvBlockStoreOptions options);
  ~KvBlockStore();  // Flush()

  KvBlockStore(const KvBlockStore&) = delete;
  KvBlockStore& operator=(const KvBlockStore&) = delete;

  // Keeps a block: `key` is the prefix cache key (PrefixCacheKey), `hash` and `parent` the
  // block's chain hash and its parent's, `tokens` its block_size tokens. The host LRU's oldest
  // entries move to disk (or are dropped) when it is over its bound.
  void Put(const std::string& key, uint64_t root, uint64_t hash, uint64_t parent,
           const std::vector<int32_t>& tokens, std::string payload);

  // The payload of the block with these identities, of exactly `payload_bytes` bytes; false
  // when no tier holds one that matches everything.
  bool Lookup(const std::string& key, uint64_t root, uint64_t hash, uint64_t parent,
              const int32_t* tokens, int32_t num_tokens, size_t payload_bytes,
              std::string* payload);

  // Writes every host entry that is not on disk yet to disk (worker shutdown).
  void Flush();
  // The worker is stopping: only the disk tier outlives the process. From here on
  // capacity_bytes() counts the disk tier alone (0 without one), so the ranks' caches, destroyed
  // next, hand over only the blocks a later worker can find, and none without a directory
  // (copying them off the device into host memory that is freed at exit would be wasted time).
  void BeginShutdown();

  bool disk_enabled() const;
  // What the tiers that outlive the ranks' caches can hold together, in bytes: host and disk,
  // the disk alone after BeginShutdown().
  int64_t capacity_bytes() const;
  KvBlockStoreStats stats() const;
  int64_t host_bytes_used() const;
  int64_t disk_bytes_used() const;

  // The file a block of the key with root hash `root` and chain hash `hash` is stored in.
  static std::string FileName(uint64_t root, uint64_t hash);

 private:
  using EntryKey = std::pair<uint64_t, uint64_t>;  // (root, hash)
  struct Entry {
    std::string key;
    uint64_t root = 0;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::string payload;
    bool on_disk = false;
    std::list<EntryKey>::iterator lru;
  };
  struct DiskFile {
    EntryKey key;
    int64_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  bool Matches(const Entry& e, const std::string& key, uint64_t parent, const int32_t* tokens,
               int32_t num_tokens, size_t payload_bytes) const;
  // Makes room under host_bytes, moving the oldest entries to disk.
  void TrimHostLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteFileLocked(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads and checks a block file; removes it when it does not match.
  bool ReadFileLocked(const std::string& key, uint64_t root, uint64_t hash, uint64_t parent,
                      const int32_t* tokens, int32_t num_tokens, size_t payload_bytes,
                      std::string* payload) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveFileLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DisableDiskLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the disk index from the directory's block files, oldest mtime first.
  void ScanDirLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvBlockStoreOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<EntryKey, Entry> host_ ABSL_GUARDED_BY(mu_);
  std::list<EntryKey> host_lru_ ABSL_GUARDED_BY(mu_);  // front: least recently used
  int64_t host_used_ ABSL_GUARDED_BY(mu_) = 0;
  bool disk_on_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, DiskFile> files_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> file_lru_ ABSL_GUARDED_BY(mu_);  // front: least recently used
  int64_t disk_used_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tmp_counter_ ABSL_GUARDED_BY(mu_) = 0;
  KvBlockStoreStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_KV_CACHE_KV_BLOCK_STORE_H_

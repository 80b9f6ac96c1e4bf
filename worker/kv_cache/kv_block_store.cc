// KvBlockStore: the host LRU, the block file format and the disk index.
#include "worker/kv_cache/kv_block_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;

// A block file: the magic, then the identity of the block (cache key, root hash, chain hash,
// parent hash, tokens), the payload's size and checksum, then the payload. Integers in the
// machine's byte order (a directory is local to one machine).
constexpr char kMagic[8] = {'D', 'I', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr char kSuffix[] = ".kvb";
// What an entry costs the host tier besides its payload and tokens.
constexpr int64_t kEntryOverhead = 128;

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// A 64-bit checksum of the payload, 8 bytes at a time: any flipped bit changes it.
uint64_t Checksum(const std::string& data) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ data.size();
  size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, data.data() + i, 8);
    h = Mix(h ^ w) + i;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, data.data() + i, data.size() - i);
  return Mix(h ^ tail ^ 0xabcdef);
}

template <typename T>
void Append(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// Reads a T at *at; false past the end.
template <typename T>
bool Take(const std::string& in, size_t* at, T* v) {
  if (*at > in.size() || in.size() - *at < sizeof(T)) return false;
  std::memcpy(v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

int64_t EntryBytes(const std::string& key, size_t tokens, size_t payload) {
  return kEntryOverhead + static_cast<int64_t>(key.size() + tokens * 4 + payload);
}

}  // namespace

std::string KvBlockStore::FileName(uint64_t root, uint64_t hash) {
  return absl::StrFormat("%016x-%016x%s", root, hash, kSuffix);
}

KvBlockStore::KvBlockStore(KvBlockStoreOptions options) : options_(std::move(options)) {
  absl::MutexLock lock(&mu_);
  if (options_.dir.empty()) return;
  if (options_.dir_bytes <= 0) {
    LOG(WARNING) << "KV cache disk tier off: a bound of " << options_.dir_bytes << " bytes for "
                 << options_.dir;
    return;
  }
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec || !fs::is_directory(options_.dir, ec)) {
    DisableDiskLocked(
        absl::StrCat("cannot create the directory: ", ec ? ec.message() : "not a directory"));
    return;
  }
  if (access(options_.dir.c_str(), W_OK | X_OK) != 0) {
    DisableDiskLocked(absl::StrCat("cannot write to it: ", strerror(errno)));
    return;
  }
  disk_on_ = true;
  ScanDirLocked();
  LOG(INFO) << "KV cache disk tier in " << options_.dir << ": " << files_.size() << " block files, "
            << disk_used_ << " of " << options_.dir_bytes << " bytes";
}

KvBlockStore::~KvBlockStore() { Flush(); }

void KvBlockStore::ScanDirLocked() {
  struct Found {
    fs::file_time_type mtime;
    std::string name;
    int64_t bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = d.path().filename().string();
    std::error_code e2;
    if (name.size() <= sizeof(kSuffix) - 1 ||
        name.compare(name.size() - (sizeof(kSuffix) - 1), std::string::npos, kSuffix) != 0 ||
        !d.is_regular_file(e2)) {
      continue;
    }
    const auto bytes = d.file_size(e2);
    if (e2) continue;
    const auto mtime = d.last_write_time(e2);
    if (e2) continue;
    found.push_back({mtime, name, static_cast<int64_t>(bytes)});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) {
    DiskFile file;
    unsigned long long root = 0, hash = 0;  // NOLINT(runtime/int): sscanf's %llx
    if (std::sscanf(f.name.c_str(), "%16llx-%16llx", &root, &hash) != 2) continue;
    file.key = {root, hash};
    file.bytes = f.bytes;
    file.lru = file_lru_.insert(file_lru_.end(), f.name);
    disk_used_ += f.bytes;
    files_.emplace(std::move(f.name), file);
  }
  // A smaller bound than last time: the oldest files go now.
  while (disk_used_ > options_.dir_bytes && !file_lru_.empty()) {
    RemoveFileLocked(file_lru_.front());
    ++stats_.disk_evictions;
  }
}

void KvBlockStore::DisableDiskLocked(const std::string& why) {
  if (!options_.dir.empty()) {
    LOG(ERROR) << "KV cache disk tier off (" << options_.dir << ": " << why
               << "); serving continues with the device and host tiers";
  }
  disk_on_ = false;
}

bool KvBlockStore::Matches(const Entry& e, const std::string& key, uint64_t parent,
                           const int32_t* tokens, int32_t num_tokens, size_t payload_bytes) const {
  return e.key == key && e.parent == parent && e.payload.size() == payload_bytes &&
         e.tokens.size() == static_cast<size_t>(num_tokens) &&
         std::equal(e.tokens.begin(), e.tokens.end(), tokens);
}

void KvBlockStore::Put(const std::string& key, uint64_t root, uint64_t hash, uint64_t parent,
                       const std::vector<int32_t>& tokens, std::string payload) {
  absl::MutexLock lock(&mu_);
  ++stats_.puts;
  const std::string name = FileName(root, hash);
  const bool on_disk = files_.contains(name);
  const EntryKey k{root, hash};
  if (auto it = host_.find(k); it != host_.end()) {
    // The same block again (evicted, restored, evicted): keep the newer copy, most recent.
    host_used_ -= EntryBytes(it->second.key, it->second.tokens.size(), it->second.payload.size());
    host_lru_.erase(it->second.lru);
    host_.erase(it);
  }
  Entry e;
  e.key = key;
  e.root = root;
  e.hash = hash;
  e.parent = parent;
  e.tokens = tokens;
  e.payload = std::move(payload);
  e.on_disk = on_disk;
  if (options_.host_bytes <= 0) {
    if (disk_on_ && !on_disk) WriteFileLocked(e);
    return;
  }
  host_used_ += EntryBytes(e.key, e.tokens.size(), e.payload.size());
  e.lru = host_lru_.insert(host_lru_.end(), k);
  host_.emplace(k, std::move(e));
  TrimHostLocked();
}

void KvBlockStore::TrimHostLocked() {
  while (host_used_ > options_.host_bytes && !host_lru_.empty()) {
    auto it = host_.find(host_lru_.front());
    host_lru_.pop_front();
    Entry& e = it->second;
    if (disk_on_ && !e.on_disk) WriteFileLocked(e);
    host_used_ -= EntryBytes(e.key, e.tokens.size(), e.payload.size());
    host_.erase(it);
  }
}

void KvBlockStore::WriteFileLocked(const Entry& e) {
  std::string data(kMagic, sizeof(kMagic));
  Append(&data, static_cast<uint32_t>(e.key.size()));
  data += e.key;
  Append(&data, e.root);
  Append(&data, e.hash);
  Append(&data, e.parent);
  Append(&data, static_cast<uint32_t>(e.tokens.size()));
  data.append(reinterpret_cast<const char*>(e.tokens.data()), e.tokens.size() * sizeof(int32_t));
  Append(&data, static_cast<uint64_t>(e.payload.size()));
  Append(&data, Checksum(e.payload));
  const int64_t bytes = static_cast<int64_t>(data.size() + e.payload.size());
  if (bytes > options_.dir_bytes) return;  // never fits
  while (disk_used_ + bytes > options_.dir_bytes && !file_lru_.empty()) {
    RemoveFileLocked(file_lru_.front());
    ++stats_.disk_evictions;
  }
  const std::string name = FileName(e.root, e.hash);
  const std::string path = absl::StrCat(options_.dir, "/", name);
  const std::string tmp =
      absl::StrCat(options_.dir, "/.tmp-", getpid(), "-", tmp_counter_++, kSuffix, ".part");
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    DisableDiskLocked(absl::StrCat("cannot create ", tmp, ": ", strerror(errno)));
    return;
  }
  bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size() &&
            std::fwrite(e.payload.data(), 1, e.payload.size(), f) == e.payload.size();
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    DisableDiskLocked(absl::StrCat("writing ", name, ": ", strerror(err)));
    return;
  }
  if (auto old = files_.find(name); old != files_.end()) {
    disk_used_ -= old->second.bytes;
    file_lru_.erase(old->second.lru);
    files_.erase(old);
  }
  DiskFile file;
  file.key = {e.root, e.hash};
  file.bytes = bytes;
  file.lru = file_lru_.insert(file_lru_.end(), name);
  files_.emplace(name, file);
  disk_used_ += bytes;
  ++stats_.disk_writes;
}

void KvBlockStore::RemoveFileLocked(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) return;
  std::error_code ec;
  fs::remove(fs::path(options_.dir) / name, ec);
  disk_used_ -= it->second.bytes;
  file_lru_.erase(it->second.lru);
  // The host copy (if any) is no longer on disk.
  if (auto h = host_.find(it->second.key); h != host_.end()) h->second.on_disk = false;
  files_.erase(it);
}

bool KvBlockStore::ReadFileLocked(const std::string& key, uint64_t root, uint64_t hash,
                                  uint64_t parent, const int32_t* tokens, int32_t num_tokens,
                                  size_t payload_bytes, std::string* payload) {
  const std::string name = FileName(root, hash);
  const std::string path = absl::StrCat(options_.dir, "/", name);
  std::string data;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      RemoveFileLocked(name);  // gone (another process's bound, or by hand)
      return false;
    }
    data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto reject = [&](const char* why) {
    LOG(WARNING) << "KV cache disk tier: " << path << " " << why << "; removed";
    ++stats_.rejected;
    RemoveFileLocked(name);
    return false;
  };
  size_t at = 0;
  if (data.size() < sizeof(kMagic) || std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return reject("is not a block file");
  }
  at = sizeof(kMagic);
  uint32_t key_len = 0;
  if (!Take(data, &at, &key_len) || data.size() - at < key_len) return reject("is truncated");
  if (data.compare(at, key_len, key) != 0 || key_len != key.size()) {
    return reject("holds a block of another model or cache layout");
  }
  at += key_len;
  uint64_t f_root = 0, f_hash = 0, f_parent = 0;
  uint32_t f_tokens = 0;
  if (!Take(data, &at, &f_root) || !Take(data, &at, &f_hash) || !Take(data, &at, &f_parent) ||
      !Take(data, &at, &f_tokens)) {
    return reject("is truncated");
  }
  if (f_root != root || f_hash != hash || f_parent != parent ||
      f_tokens != static_cast<uint32_t>(num_tokens)) {
    return reject("holds another block");
  }
  if (data.size() - at < f_tokens * sizeof(int32_t)) return reject("is truncated");
  if (std::memcmp(data.data() + at, tokens, f_tokens * sizeof(int32_t)) != 0) {
    return reject("holds other tokens");
  }
  at += f_tokens * sizeof(int32_t);
  uint64_t size = 0, sum = 0;
  if (!Take(data, &at, &size) || !Take(data, &at, &sum)) return reject("is truncated");
  if (size != payload_bytes || data.size() - at != size) return reject("has a wrong size");
  payload->assign(data, at, size);
  if (Checksum(*payload) != sum) {
    payload->clear();
    return reject("fails its checksum");
  }
  // Most recently used, here and for the next process's scan.
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
  auto it = files_.find(name);
  file_lru_.splice(file_lru_.end(), file_lru_, it->second.lru);
  return true;
}

bool KvBlockStore::Lookup(const std::string& key, uint64_t root, uint64_t hash, uint64_t parent,
                          const int32_t* tokens, int32_t num_tokens, size_t payload_bytes,
                          std::string* payload) {
  absl::MutexLock lock(&mu_);
  const EntryKey k{root, hash};
  if (auto it = host_.find(k); it != host_.end()) {
    if (Matches(it->second, key, parent, tokens, num_tokens, payload_bytes)) {
      *payload = it->second.payload;
      host_lru_.splice(host_lru_.end(), host_lru_, it->second.lru);
      ++stats_.host_hits;
      return true;
    }
  }
  const std::string name = FileName(root, hash);
  if (disk_on_ && files_.contains(name) &&
      ReadFileLocked(key, root, hash, parent, tokens, num_tokens, payload_bytes, payload)) {
    ++stats_.disk_hits;
    return true;
  }
  ++stats_.misses;
  return false;
}

void KvBlockStore::Flush() {
  absl::MutexLock lock(&mu_);
  if (!disk_on_) return;
  int64_t written = stats_.disk_writes;
  for (const EntryKey& k : host_lru_) {
    Entry& e = host_.at(k);
    if (e.on_disk) continue;
    WriteFileLocked(e);
    if (!disk_on_) break;
    e.on_disk = files_.contains(FileName(e.root, e.hash));
  }
  written = stats_.disk_writes - written;
  if (written > 0) {
    LOG(INFO) << "KV cache disk tier: " << written << " blocks written to " << options_.dir;
  }
}

bool KvBlockStore::disk_enabled() const {
  absl::MutexLock lock(&mu_);
  return disk_on_;
}

void KvBlockStore::BeginShutdown() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
}

int64_t KvBlockStore::capacity_bytes() const {
  absl::MutexLock lock(&mu_);
  const int64_t host = shutting_down_ ? 0 : std::max<int64_t>(0, options_.host_bytes);
  return host + (disk_on_ ? options_.dir_bytes : 0);
}

KvBlockStoreStats KvBlockStore::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

int64_t KvBlockStore::host_bytes_used() const {
  absl::MutexLock lock(&mu_);
  return host_used_;
}

int64_t KvBlockStore::disk_bytes_used() const {
  absl::MutexLock lock(&mu_);
  return disk_used_;
}

}  // namespace deepinfer

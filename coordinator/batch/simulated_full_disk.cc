#include "coordinator/batch/simulated_full_disk.h"

#include <sqlite3.h>
#include <sys/types.h>

#include <atomic>
#include <cerrno>
#include <type_traits>

#include "glog/logging.h"

namespace deepinfer {
namespace {

std::atomic<bool> installed{false};
std::atomic<bool> full{false};
std::atomic<int64_t> refused{0};

using WriteFn = ssize_t (*)(int, const void*, size_t);
using PwriteFn = ssize_t (*)(int, const void*, size_t, off_t);
WriteFn real_write = nullptr;
PwriteFn real_pwrite = nullptr;
PwriteFn real_pwrite64 = nullptr;

bool Refuse() {
  if (!full.load()) return false;
  refused.fetch_add(1);
  errno = ENOSPC;
  return true;
}

ssize_t Write(int fd, const void* data, size_t n) {
  return Refuse() ? -1 : real_write(fd, data, n);
}
ssize_t Pwrite(int fd, const void* data, size_t n, off_t at) {
  return Refuse() ? -1 : real_pwrite(fd, data, n, at);
}
ssize_t Pwrite64(int fd, const void* data, size_t n, off_t at) {
  return Refuse() ? -1 : real_pwrite64(fd, data, n, at);
}

}  // namespace

SimulatedFullDisk::SimulatedFullDisk() {
  CHECK(!installed.exchange(true)) << "one SimulatedFullDisk at a time";
  CHECK_EQ(sqlite3_initialize(), SQLITE_OK);
  sqlite3_vfs* vfs = sqlite3_vfs_find(nullptr);
  CHECK(vfs != nullptr && vfs->iVersion >= 3) << "SQLite's default VFS has no system calls to set";
  // Whichever of these the build uses (pwrite64 on Linux, with write for some files).
  int replaced = 0;
  auto set = [&](const char* name, sqlite3_syscall_ptr replacement, auto* real) {
    sqlite3_syscall_ptr current = vfs->xGetSystemCall(vfs, name);
    if (current == nullptr) return;
    *real = reinterpret_cast<std::remove_pointer_t<decltype(real)>>(current);
    CHECK_EQ(vfs->xSetSystemCall(vfs, name, replacement), SQLITE_OK) << name;
    ++replaced;
  };
  set("write", reinterpret_cast<sqlite3_syscall_ptr>(&Write), &real_write);
  set("pwrite", reinterpret_cast<sqlite3_syscall_ptr>(&Pwrite), &real_pwrite);
  set("pwrite64", reinterpret_cast<sqlite3_syscall_ptr>(&Pwrite64), &real_pwrite64);
  CHECK_GT(replaced, 0) << "SQLite's default VFS has none of write, pwrite, pwrite64";
  full = false;
  refused = 0;
}

SimulatedFullDisk::~SimulatedFullDisk() {
  sqlite3_vfs* vfs = sqlite3_vfs_find(nullptr);
  vfs->xSetSystemCall(vfs, nullptr, nullptr);  // all back to their defaults
  full = false;
  installed = false;
}

void SimulatedFullDisk::set_full(bool is_full) { full = is_full; }

int64_t SimulatedFullDisk::refused_writes() const { return refused.load(); }

}  // namespace deepinfer

// SimulatedFullDisk (tests only): SQLite's writes fail as on a full disk, for tests of what the
// coordinator does when its state directory fills. It replaces the write system calls of
// SQLite's default VFS ("unix") through sqlite3_vfs::xSetSystemCall, SQLite's own seam for
// fault injection, so SQLite runs its real error paths: while `full`, every write to a
// database, its WAL or its journal fails with ENOSPC and SQLite reports SQLITE_FULL. Reads and
// files written without SQLite are not affected.
//
// Process-wide: one instance at a time; the destructor puts the system calls back.
#ifndef DEEPINFER_COORDINATOR_BATCH_SIMULATED_FULL_DISK_H_
#define DEEPINFER_COORDINATOR_BATCH_SIMULATED_FULL_DISK_H_

#include <cstdint>

namespace deepinfer {

class SimulatedFullDisk {
 public:
  SimulatedFullDisk();  // not full yet
  ~SimulatedFullDisk();
  SimulatedFullDisk(const SimulatedFullDisk&) = delete;
  SimulatedFullDisk& operator=(const SimulatedFullDisk&) = delete;

  void set_full(bool full);
  // Writes refused so far.
  int64_t refused_writes() const;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_SIMULATED_FULL_DISK_H_

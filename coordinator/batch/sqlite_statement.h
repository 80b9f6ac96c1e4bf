// SQLite helpers of the job store: a prepared statement that finalizes itself, and failed calls
// as absl::Status (a full disk is RESOURCE_EXHAUSTED, a database held by another process
// FAILED_PRECONDITION).
#ifndef DEEPINFER_COORDINATOR_BATCH_SQLITE_STATEMENT_H_
#define DEEPINFER_COORDINATOR_BATCH_SQLITE_STATEMENT_H_

#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace deepinfer {
namespace sqlite {

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const;
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindNull(int i) { sqlite3_bind_null(stmt_, i); }
  // Ready to bind and step again.
  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return sqlite3_step(stmt_); }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }
  bool IsNull(int col) { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// A failed SQLite call (`rc`) as a Status: RESOURCE_EXHAUSTED when a write found the disk
// full, FAILED_PRECONDITION when another process holds the database, INTERNAL otherwise
// (naming `sql` when given).
absl::Status SqliteError(sqlite3* db, int rc, const std::string& sql);

// Runs `sql` (no results).
absl::Status Exec(sqlite3* db, const std::string& sql);

// Steps `s` once, expecting SQLITE_DONE.
absl::Status StepDone(Statement& s, sqlite3* db);

// COMMIT; when that fails (a full disk), ROLLBACK if the transaction is still open, so that
// the next BEGIN works.
absl::Status Commit(sqlite3* db);

}  // namespace sqlite
}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_SQLITE_STATEMENT_H_

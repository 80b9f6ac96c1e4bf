#include "coordinator/batch/sqlite_statement.h"

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace sqlite {

absl::Status Statement::status() const {
  if (rc_ == SQLITE_OK) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
}

absl::Status SqliteError(sqlite3* db, int rc, const std::string& sql) {
  const std::string message = absl::StrCat("sqlite: ", sqlite3_errmsg(db));
  const char* file = sqlite3_db_filename(db, "main");
  const int primary = rc & 0xff;
  if (primary == SQLITE_FULL || (primary == SQLITE_IOERR && sqlite3_system_errno(db) == ENOSPC)) {
    return absl::ResourceExhaustedError(absl::StrCat(message, " (", file ? file : "", ")"));
  }
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    return absl::FailedPreconditionError(
        absl::StrCat(message, " (", file ? file : "",
                     " is held by another process: one coordinator per state directory)"));
  }
  return absl::InternalError(absl::StrCat(message, sql.empty() ? "" : " in: ", sql));
}

absl::Status Exec(sqlite3* db, const std::string& sql) {
  if (int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr); rc != SQLITE_OK) {
    return SqliteError(db, rc, sql);
  }
  return absl::OkStatus();
}

absl::Status StepDone(Statement& s, sqlite3* db) {
  if (int rc = s.Step(); rc != SQLITE_DONE) return SqliteError(db, rc, "");
  return absl::OkStatus();
}

absl::Status Commit(sqlite3* db) {
  absl::Status status = Exec(db, "COMMIT");
  if (!status.ok() && sqlite3_get_autocommit(db) == 0) (void)Exec(db, "ROLLBACK");
  return status;
}

}  // namespace sqlite
}  // namespace deepinfer

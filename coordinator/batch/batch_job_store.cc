#include "coordinator/batch/batch_job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// A prepared statement that finalizes itself.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const {
    if (rc_ == SQLITE_OK) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("sqlite prepare: ", sqlite3_errmsg(db_)));
  }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  // SQLITE_ROW, SQLITE_DONE, or an error code.
  int Step() { return sqlite3_step(stmt_); }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, col))
             : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// A failed SQLite call (`rc`) as a Status: RESOURCE_EXHAUSTED when a write found the disk
// full, FAILED_PRECONDITION when another process holds the database, INTERNAL otherwise
// (naming `sql` when given).
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

// COMMIT; when that fails (a full disk), ROLLBACK if the transaction is still open, so that
// the next BEGIN works.
absl::Status Commit(sqlite3* db) {
  absl::Status status = Exec(db, "COMMIT");
  if (!status.ok() && sqlite3_get_autocommit(db) == 0) (void)Exec(db, "ROLLBACK");
  return status;
}

// The last file operation on `path` failed (errno): RESOURCE_EXHAUSTED for a full disk.
absl::Status FileError(const std::string& what, const std::string& path) {
  const int error = errno;
  std::string message = absl::StrCat("cannot ", what, " '", path, "': ", strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(std::move(message));
  return absl::InternalError(std::move(message));
}

// Appends `lines` to `out` (each with a newline) and closes it.
absl::Status AppendAndClose(std::FILE* out, const std::vector<std::string>& lines,
                            const std::string& path) {
  bool ok = true;
  for (const std::string& line : lines) {
    ok = ok && std::fwrite(line.data(), 1, line.size(), out) == line.size() &&
         std::fputc('\n', out) != EOF;
  }
  ok = std::fflush(out) == 0 && ok;
  absl::Status status = ok ? absl::OkStatus() : FileError("write", path);
  if (std::fclose(out) != 0 && status.ok()) status = FileError("write", path);
  return status;
}

absl::Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory '", path, "': ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%016x", absl::Uniform<uint64_t>(gen));
}

bool IsFinal(Job::State s) {
  return s == Job::COMPLETED || s == Job::FAILED || s == Job::CANCELLED;
}

// A file's complete lines, where the last of them ends and its size (all 0 if it is missing).
// Reads no more than the size it has when opened.
struct LineCount {
  int64_t lines = 0;
  int64_t complete_bytes = 0;
  int64_t size = 0;
};
LineCount CountLines(const std::string& path) {
  LineCount count;
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) return count;
  struct stat st;
  const int64_t size = fstat(fileno(in), &st) == 0 ? st.st_size : 0;
  char buffer[1 << 16];
  size_t n;
  while (count.size < size &&
         (n = std::fread(buffer, 1, std::min<int64_t>(sizeof(buffer), size - count.size), in)) >
             0) {
    for (size_t i = 0; i < n; ++i) {
      if (buffer[i] != '\n') continue;
      ++count.lines;
      count.complete_bytes = count.size + static_cast<int64_t>(i) + 1;
    }
    count.size += static_cast<int64_t>(n);
  }
  std::fclose(in);
  return count;
}

constexpr char kJobColumns[] =
    "job_id, name, state, total, completed, failed, created_ms, finished_ms, error, "
    "generated_tokens";

Job ReadJob(Statement& s) {
  Job job;
  job.set_job_id(s.Text(0));
  job.set_name(s.Text(1));
  job.set_state(static_cast<Job::State>(s.Int(2)));
  job.set_total_requests(s.Int(3));
  job.set_completed_requests(s.Int(4));
  job.set_failed_requests(s.Int(5));
  job.set_created_unix_ms(s.Int(6));
  job.set_finished_unix_ms(s.Int(7));
  job.set_error(s.Text(8));
  job.set_generated_tokens(s.Int(9));
  return job;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchJobStore>> BatchJobStore::Open(const std::string& state_dir) {
  std::unique_ptr<BatchJobStore> store(new BatchJobStore(state_dir));
  if (absl::Status s = store->Init(); !s.ok()) return s;
  return store;
}

BatchJobStore::~BatchJobStore() {
  absl::MutexLock lock(&mu_);
  if (db_ != nullptr) sqlite3_close(db_);
}

absl::Status BatchJobStore::Init() {
  if (absl::Status s = MakeDir(state_dir_); !s.ok()) return s;
  if (absl::Status s = MakeDir(state_dir_ + "/jobs"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  const std::string path = state_dir_ + "/deepinfer.db";
  if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) {
    return absl::InternalError(
        absl::StrCat("cannot open job database '", path, "': ", sqlite3_errmsg(db_)));
  }
  for (const char* sql : {
           // Before WAL: the WAL index then lives in this process's memory instead of a
           // shared-memory file, which a full disk would not let SQLite create (reads would
           // fail as well as writes). It also keeps a second coordinator out.
           "PRAGMA locking_mode=EXCLUSIVE",
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",
           "CREATE TABLE IF NOT EXISTS jobs(job_id TEXT PRIMARY KEY, name TEXT, state INTEGER, "
           "total INTEGER, completed INTEGER DEFAULT 0, failed INTEGER DEFAULT 0, "
           "created_ms INTEGER, finished_ms INTEGER DEFAULT 0, error TEXT DEFAULT '', "
           "generated_tokens INTEGER DEFAULT 0)",
           "CREATE TABLE IF NOT EXISTS requests(job_id TEXT, line_number INTEGER, "
           "result_seq INTEGER, failed INTEGER DEFAULT 0, output TEXT, "
           "PRIMARY KEY(job_id, line_number))",
       }) {
    if (absl::Status s = Exec(db_, sql); !s.ok()) return s;
  }
  // A state directory made before jobs counted their loads gets the column.
  bool has_load_attempts = false;
  {
    Statement columns(db_, "PRAGMA table_info(jobs)");
    if (!columns.status().ok()) return columns.status();
    while (columns.Step() == SQLITE_ROW) has_load_attempts |= columns.Text(1) == "load_attempts";
  }
  if (!has_load_attempts) {
    if (absl::Status s = Exec(db_, "ALTER TABLE jobs ADD COLUMN load_attempts INTEGER DEFAULT 0");
        !s.ok()) {
      return s;
    }
  }
  return RepairOutputFilesLocked();
}

std::string BatchJobStore::OutputPath(const std::string& job_id) const {
  return absl::StrCat(state_dir_, "/jobs/", job_id, "/output.jsonl");
}

std::string BatchJobStore::InputPath(const std::string& job_id) const {
  return absl::StrCat(state_dir_, "/jobs/", job_id, "/input.jsonl");
}

absl::Status BatchJobStore::RepairOutputFilesLocked() {
  std::vector<std::pair<std::string, int64_t>> jobs;
  {
    Statement s(db_, "SELECT job_id, completed + failed FROM jobs");
    if (!s.status().ok()) return s.status();
    while (s.Step() == SQLITE_ROW) jobs.emplace_back(s.Text(0), s.Int(1));
  }
  for (const auto& [job_id, results] : jobs) {
    if (absl::Status s = CatchUpOutputFileLocked(job_id, results); !s.ok()) {
      // Not fatal: the results are in the database; CatchUpOutputFiles tries again.
      LOG(ERROR) << "job " << job_id << ": " << s.message()
                 << "; the output file lags the database until there is room";
      lagging_outputs_.insert(job_id);
    }
  }
  return absl::OkStatus();
}

absl::Status BatchJobStore::CatchUpOutputFileLocked(const std::string& job_id, int64_t results) {
  const std::string path = OutputPath(job_id);
  const LineCount file = CountLines(path);
  if (file.lines == results && file.complete_bytes == file.size) return absl::OkStatus();
  // Rewritten whole when it holds more lines than there are results (not a prefix of them).
  const bool rewrite = file.lines > results;
  LOG(WARNING) << "job " << job_id << ": output file does not match the database (" << file.lines
               << " complete lines, " << results << " results); "
               << (rewrite ? "rewriting it" : "appending the missing lines");
  std::vector<std::string> lines;
  {
    Statement s(db_,
                "SELECT output FROM requests WHERE job_id = ? AND result_seq > ? "
                "ORDER BY result_seq");
    if (!s.status().ok()) return s.status();
    s.Bind(1, job_id);
    s.Bind(2, rewrite ? int64_t{0} : file.lines);
    while (s.Step() == SQLITE_ROW) lines.push_back(s.Text(0));
  }
  if (!rewrite) {
    if (file.size > file.complete_bytes && truncate(path.c_str(), file.complete_bytes) != 0) {
      return FileError("truncate", path);
    }
    std::FILE* out = std::fopen(path.c_str(), "ab");
    if (out == nullptr) return FileError("open", path);
    return AppendAndClose(out, lines, path);
  }
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) return FileError("open", tmp);
  absl::Status status = AppendAndClose(out, lines, tmp);
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = FileError("rename", tmp);
  }
  if (!status.ok()) std::remove(tmp.c_str());  // what it holds would only take room
  return status;
}

absl::Status BatchJobStore::CatchUpOutputFiles() {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  for (auto it = lagging_outputs_.begin(); it != lagging_outputs_.end();) {
    auto next = std::next(it);
    absl::StatusOr<Job> job = GetJobLocked(*it);
    absl::Status s = job.status();
    if (s.ok()) {
      s = CatchUpOutputFileLocked(*it, job->completed_requests() + job->failed_requests());
    }
    if (s.ok()) {
      LOG(INFO) << "job " << *it << ": the output file is level with the database again";
      lagging_outputs_.erase(it);
    } else if (first.ok()) {
      first = s;
    }
    it = next;
  }
  return first;
}

bool BatchJobStore::OutputFilesBehind() const {
  absl::MutexLock lock(&mu_);
  return !lagging_outputs_.empty();
}

absl::StatusOr<std::string> BatchJobStore::CreateJob(const std::string& name,
                                                     const std::string& input_jsonl,
                                                     int64_t now_unix_ms) {
  std::vector<int64_t> line_numbers;
  int64_t n = 0;
  for (absl::string_view line : absl::StrSplit(input_jsonl, '\n')) {
    ++n;
    if (!absl::StripAsciiWhitespace(line).empty()) line_numbers.push_back(n);
  }
  if (line_numbers.empty()) {
    return absl::InvalidArgumentError("the job's input has no request lines");
  }
  const std::string job_id = NewJobId();
  const std::string dir = absl::StrCat(state_dir_, "/jobs/", job_id);
  if (absl::Status s = MakeDir(dir); !s.ok()) return s;
  {
    std::ofstream in(InputPath(job_id), std::ios::trunc | std::ios::binary);
    in << input_jsonl;
    std::ofstream out(OutputPath(job_id), std::ios::trunc);
    if (!in.good() || !out.good()) {
      return absl::InternalError(absl::StrCat("cannot write the job files in '", dir, "'"));
    }
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    Statement job(db_,
                  "INSERT INTO jobs(job_id, name, state, total, created_ms, load_attempts) "
                  "VALUES(?, ?, ?, ?, ?, 1)");
    if (!job.status().ok()) return job.status();
    job.Bind(1, job_id);
    job.Bind(2, name);
    job.Bind(3, static_cast<int64_t>(Job::QUEUED));
    job.Bind(4, static_cast<int64_t>(line_numbers.size()));
    job.Bind(5, now_unix_ms);
    if (absl::Status s = StepDone(job, db_); !s.ok()) return s;
    for (int64_t line : line_numbers) {
      Statement r(db_, "INSERT INTO requests(job_id, line_number) VALUES(?, ?)");
      r.Bind(1, job_id);
      r.Bind(2, line);
      if (absl::Status s = StepDone(r, db_); !s.ok()) return s;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return status;
  }
  if (absl::Status s = Commit(db_); !s.ok()) return s;
  return job_id;
}

absl::StatusOr<bool> BatchJobStore::RecordResult(const std::string& job_id, int64_t line_number,
                                                 const std::string& output_line, bool failed) {
  absl::StatusOr<std::vector<bool>> recorded =
      RecordResults({Result{job_id, line_number, output_line, failed}});
  if (!recorded.ok()) return recorded.status();
  return (*recorded)[0];
}

absl::StatusOr<std::vector<bool>> BatchJobStore::RecordResults(const std::vector<Result>& results) {
  for (const Result& r : results) {
    if (r.output_line.find('\n') != std::string::npos) {
      return absl::InvalidArgumentError("an output line must not contain a newline");
    }
  }
  std::vector<bool> recorded(results.size(), false);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      Statement find(db_,
                     "SELECT result_seq IS NOT NULL FROM requests WHERE job_id = ? AND "
                     "line_number = ?");
      find.Bind(1, r.job_id);
      find.Bind(2, r.line_number);
      if (find.Step() != SQLITE_ROW) {
        return absl::NotFoundError(
            absl::StrCat("job ", r.job_id, " has no request on line ", r.line_number));
      }
      if (find.Int(0) != 0) continue;
      Statement update(db_,
                       "UPDATE requests SET output = ?, failed = ?, result_seq = "
                       "(SELECT completed + failed + 1 FROM jobs WHERE job_id = ?) "
                       "WHERE job_id = ? AND line_number = ?");
      update.Bind(1, r.output_line);
      update.Bind(2, static_cast<int64_t>(r.failed));
      update.Bind(3, r.job_id);
      update.Bind(4, r.job_id);
      update.Bind(5, r.line_number);
      if (absl::Status s = StepDone(update, db_); !s.ok()) return s;
      Statement count(db_, r.failed ? "UPDATE jobs SET failed = failed + 1, generated_tokens = "
                                      "generated_tokens + ? WHERE job_id = ?"
                                    : "UPDATE jobs SET completed = completed + 1, "
                                      "generated_tokens = generated_tokens + ? WHERE job_id = ?");
      count.Bind(1, r.generated_tokens);
      count.Bind(2, r.job_id);
      if (absl::Status s = StepDone(count, db_); !s.ok()) return s;
      recorded[i] = true;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return status;
  }
  if (absl::Status s = Commit(db_); !s.ok()) return s;
  // Committed: now the files, in recording order. An append lost to a crash is made up by
  // Open(), one that fails by CatchUpOutputFiles (the file's appends wait for it).
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string& job_id = results[i].job_id;
    if (!recorded[i] || lagging_outputs_.contains(job_id)) continue;
    const std::string path = OutputPath(job_id);
    std::FILE* out = std::fopen(path.c_str(), "ab");
    absl::Status appended = out == nullptr ? FileError("open", path)
                                           : AppendAndClose(out, {results[i].output_line}, path);
    if (!appended.ok()) {
      LOG(ERROR) << "job " << job_id << ": " << appended.message()
                 << "; the result is in the database, and the file lags it until there is room";
      lagging_outputs_.insert(job_id);
    }
  }
  return recorded;
}

absl::StatusOr<int64_t> BatchJobStore::StartLoading(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  {
    Statement s(db_, "UPDATE jobs SET load_attempts = load_attempts + 1 WHERE job_id = ?");
    if (!s.status().ok()) return s.status();
    s.Bind(1, job_id);
    if (absl::Status st = StepDone(s, db_); !st.ok()) return st;
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  Statement s(db_, "SELECT load_attempts FROM jobs WHERE job_id = ?");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  if (s.Step() != SQLITE_ROW) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return s.Int(0);
}

absl::Status BatchJobStore::FinishedLoading(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  Statement s(db_, "UPDATE jobs SET load_attempts = 0 WHERE job_id = ?");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  if (absl::Status st = StepDone(s, db_); !st.ok()) return st;
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return absl::OkStatus();
}

absl::Status BatchJobStore::SetJobState(const std::string& job_id, Job::State state,
                                        const std::string& error, int64_t now_unix_ms) {
  absl::MutexLock lock(&mu_);
  Statement s(db_, "UPDATE jobs SET state = ?, error = ?, finished_ms = ? WHERE job_id = ?");
  if (!s.status().ok()) return s.status();
  s.Bind(1, static_cast<int64_t>(state));
  s.Bind(2, error);
  s.Bind(3, IsFinal(state) ? now_unix_ms : int64_t{0});
  s.Bind(4, job_id);
  if (absl::Status st = StepDone(s, db_); !st.ok()) return st;
  if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Job>> BatchJobStore::QueryJobsLocked(
    const std::string& where_sql, const std::vector<std::string>& args) const {
  Statement s(db_, absl::StrCat("SELECT ", kJobColumns, " FROM jobs ", where_sql));
  if (!s.status().ok()) return s.status();
  for (size_t i = 0; i < args.size(); ++i) s.Bind(static_cast<int>(i + 1), args[i]);
  std::vector<Job> jobs;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) jobs.push_back(ReadJob(s));
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  return jobs;
}

absl::StatusOr<Job> BatchJobStore::GetJobLocked(const std::string& job_id) const {
  auto jobs = QueryJobsLocked("WHERE job_id = ?", {job_id});
  if (!jobs.ok()) return jobs.status();
  if (jobs->empty()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return (*jobs)[0];
}

absl::StatusOr<Job> BatchJobStore::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  return GetJobLocked(job_id);
}

absl::StatusOr<std::vector<Job>> BatchJobStore::ListJobs(int page_size,
                                                         const std::string& page_token) const {
  if (page_size <= 0) page_size = 100;
  absl::MutexLock lock(&mu_);
  const std::string limit = absl::StrCat(" ORDER BY rowid DESC LIMIT ", page_size);
  if (page_token.empty()) return QueryJobsLocked(limit, {});
  if (!GetJobLocked(page_token).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad page token '", page_token, "'"));
  }
  return QueryJobsLocked(
      absl::StrCat("WHERE rowid < (SELECT rowid FROM jobs WHERE job_id = ?)", limit), {page_token});
}

absl::StatusOr<std::vector<Job>> BatchJobStore::UnfinishedJobs() const {
  absl::MutexLock lock(&mu_);
  return QueryJobsLocked(
      absl::StrFormat("WHERE state IN (%d, %d) ORDER BY rowid", Job::QUEUED, Job::RUNNING), {});
}

absl::StatusOr<std::vector<StoredRequest>> BatchJobStore::PendingRequests(
    const std::string& job_id) const {
  std::vector<int64_t> pending;
  {
    absl::MutexLock lock(&mu_);
    if (auto job = GetJobLocked(job_id); !job.ok()) return job.status();
    Statement s(db_,
                "SELECT line_number FROM requests WHERE job_id = ? AND result_seq IS NULL "
                "ORDER BY line_number");
    s.Bind(1, job_id);
    while (s.Step() == SQLITE_ROW) pending.push_back(s.Int(0));
  }
  std::ifstream in(InputPath(job_id), std::ios::binary);
  if (!in) return absl::DataLossError(absl::StrCat("input file of job ", job_id, " is missing"));
  std::vector<StoredRequest> out;
  std::string line;
  int64_t n = 0;
  size_t next = 0;
  while (next < pending.size() && std::getline(in, line)) {
    ++n;
    if (n == pending[next]) {
      out.push_back({n, line});
      ++next;
    }
  }
  if (next != pending.size()) {
    return absl::DataLossError(absl::StrCat("input file of job ", job_id, " is truncated"));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> BatchJobStore::ReadResults(const std::string& job_id,
                                                                    int64_t offset,
                                                                    int64_t max_lines) const {
  if (offset < 0) return absl::InvalidArgumentError("negative offset");
  absl::MutexLock lock(&mu_);
  if (auto job = GetJobLocked(job_id); !job.ok()) return job.status();
  Statement s(db_,
              "SELECT output FROM requests WHERE job_id = ? AND result_seq > ? "
              "ORDER BY result_seq LIMIT ?");
  s.Bind(1, job_id);
  s.Bind(2, offset);
  s.Bind(3, max_lines > 0 ? max_lines : int64_t{1} << 40);
  std::vector<std::string> lines;
  while (s.Step() == SQLITE_ROW) lines.push_back(s.Text(0));
  return lines;
}

}  // namespace deepinfer

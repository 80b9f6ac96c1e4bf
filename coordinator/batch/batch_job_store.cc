#include "coordinator/batch/batch_job_store.h"

#include <dirent.h>
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
#include "coordinator/batch/sqlite_statement.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

using sqlite::Commit;
using sqlite::Exec;
using sqlite::SqliteError;
using sqlite::Statement;
using sqlite::StepDone;

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
    "generated_tokens, validated";

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
  job.set_validated_requests(job.state() == Job::VALIDATING ? s.Int(10) : job.total_requests());
  return job;
}

// Columns added after the first release of the schema: (table, column, declaration).
struct AddedColumn {
  const char* table;
  const char* column;
  const char* declaration;
};
constexpr AddedColumn kAddedColumns[] = {
    {"jobs", "load_attempts", "INTEGER DEFAULT 0"},
    {"jobs", "idempotency_key", "TEXT"},
    {"jobs", "input_sha256", "BLOB"},
    {"jobs", "validated", "INTEGER DEFAULT 0"},
    {"jobs", "validated_offset", "INTEGER DEFAULT 0"},
    {"jobs", "validated_line", "INTEGER DEFAULT 1"},
    {"requests", "request", "BLOB"},
    {"requests", "reserved_tokens", "INTEGER DEFAULT 0"},
};

absl::StatusOr<bool> HasColumn(sqlite3* db, const char* table, const char* column) {
  Statement columns(db, absl::StrCat("PRAGMA table_info(", table, ")"));
  if (!columns.status().ok()) return columns.status();
  while (columns.Step() == SQLITE_ROW) {
    if (columns.Text(1) == column) return true;
  }
  return false;
}

// Removes the files of a directory (not recursively); errors are ignored.
void ClearDirectory(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::remove(absl::StrCat(dir, "/", name).c_str());
  }
  closedir(d);
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
           // The custom ids claimed by the lines of jobs being validated.
           "CREATE TABLE IF NOT EXISTS custom_ids(job_id TEXT, custom_id TEXT, "
           "line_number INTEGER, PRIMARY KEY(job_id, custom_id)) WITHOUT ROWID",
       }) {
    if (absl::Status s = Exec(db_, sql); !s.ok()) return s;
  }
  if (absl::Status s = MigrateLocked(); !s.ok()) return s;
  if (absl::Status s = Exec(db_,
                            "CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_idempotency_key ON "
                            "jobs(idempotency_key) WHERE idempotency_key IS NOT NULL");
      !s.ok()) {
    return s;
  }
  // Uploads that were under way when the last coordinator stopped have no job.
  if (absl::Status s = MakeDir(StagingDir()); !s.ok()) return s;
  ClearDirectory(StagingDir());
  return RepairOutputFilesLocked();
}

absl::Status BatchJobStore::MigrateLocked() {
  bool validation_added = false;
  for (const AddedColumn& c : kAddedColumns) {
    absl::StatusOr<bool> has = HasColumn(db_, c.table, c.column);
    if (!has.ok()) return has.status();
    if (*has) continue;
    if (absl::Status s = Exec(db_, absl::StrCat("ALTER TABLE ", c.table, " ADD COLUMN ", c.column,
                                                " ", c.declaration));
        !s.ok()) {
      return s;
    }
    validation_added |= std::string(c.column) == "validated_offset";
  }
  if (validation_added) {
    // Unfinished jobs of a state directory from before validated requests were stored are
    // validated again; the results they have stay.
    return Exec(db_, absl::StrFormat("UPDATE jobs SET state = %d WHERE state IN (%d, %d)",
                                     Job::VALIDATING, Job::QUEUED, Job::RUNNING));
  }
  return absl::OkStatus();
}

std::string BatchJobStore::OutputPath(const std::string& job_id) const {
  return absl::StrCat(state_dir_, "/jobs/", job_id, "/output.jsonl");
}

std::string BatchJobStore::InputPath(const std::string& job_id) const {
  return absl::StrCat(state_dir_, "/jobs/", job_id, "/input.jsonl");
}

std::string BatchJobStore::StagingDir() const { return state_dir_ + "/uploads"; }

std::string BatchJobStore::NewStagingPath() const {
  absl::BitGen gen;
  return absl::StrFormat("%s/%016x%016x.jsonl", StagingDir(), absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
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
  absl::StatusOr<std::unique_ptr<JobInputUpload>> upload =
      JobInputUpload::Create(NewStagingPath(), static_cast<int64_t>(input_jsonl.size()));
  if (!upload.ok()) return upload.status();
  if (absl::Status s = (*upload)->Append(input_jsonl); !s.ok()) return s;
  absl::StatusOr<StagedInput> staged = (*upload)->Finish("");
  if (!staged.ok()) return staged.status();
  absl::StatusOr<CreatedJob> created = CreateJob(name, "", *staged, now_unix_ms);
  if (!created.ok()) return created.status();
  return created->job_id;
}

absl::StatusOr<BatchJobStore::CreatedJob> BatchJobStore::CreateJob(
    const std::string& name, const std::string& idempotency_key, const StagedInput& staged,
    int64_t now_unix_ms) {
  auto discard = [&] { std::remove(staged.path.c_str()); };
  absl::MutexLock lock(&mu_);
  if (!idempotency_key.empty()) {
    Statement find(db_, "SELECT job_id, input_sha256 FROM jobs WHERE idempotency_key = ?");
    if (!find.status().ok()) return find.status();
    find.Bind(1, idempotency_key);
    if (find.Step() == SQLITE_ROW) {
      discard();
      const std::string stored_sha256 = find.Blob(1);
      if (!stored_sha256.empty() && !staged.sha256.empty() && stored_sha256 != staged.sha256) {
        return absl::AlreadyExistsError(absl::StrCat("idempotency key '", idempotency_key,
                                                     "' belongs to job ", find.Text(0),
                                                     ", whose input was different"));
      }
      return CreatedJob{find.Text(0), true};
    }
  }
  if (staged.request_lines == 0) {
    discard();
    return absl::InvalidArgumentError("the job's input has no request lines");
  }
  const std::string job_id = NewJobId();
  const std::string dir = absl::StrCat(state_dir_, "/jobs/", job_id);
  if (absl::Status s = MakeDir(dir); !s.ok()) {
    discard();
    return s;
  }
  auto remove_dir = [&] {
    std::remove(InputPath(job_id).c_str());
    std::remove(OutputPath(job_id).c_str());
    rmdir(dir.c_str());
  };
  if (std::rename(staged.path.c_str(), InputPath(job_id).c_str()) != 0) {
    discard();
    remove_dir();
    return absl::InternalError(absl::StrCat("cannot move '", staged.path, "' to '",
                                            InputPath(job_id), "': ", strerror(errno)));
  }
  if (std::FILE* out = std::fopen(OutputPath(job_id).c_str(), "wb"); out != nullptr) {
    std::fclose(out);
  } else {
    absl::Status error = FileError("create", OutputPath(job_id));
    remove_dir();
    return error;
  }
  Statement job(db_,
                "INSERT INTO jobs(job_id, name, state, total, created_ms, load_attempts, "
                "idempotency_key, input_sha256, validated, validated_offset, validated_line) "
                "VALUES(?, ?, ?, ?, ?, 0, ?, ?, 0, 0, 1)");
  if (!job.status().ok()) {
    remove_dir();
    return job.status();
  }
  job.Bind(1, job_id);
  job.Bind(2, name);
  job.Bind(3, static_cast<int64_t>(Job::VALIDATING));
  job.Bind(4, staged.request_lines);
  job.Bind(5, now_unix_ms);
  if (idempotency_key.empty()) {
    job.BindNull(6);
  } else {
    job.Bind(6, idempotency_key);
  }
  job.BindBlob(7, staged.sha256);
  if (absl::Status s = StepDone(job, db_); !s.ok()) {
    remove_dir();
    return s;
  }
  return CreatedJob{job_id, false};
}

absl::StatusOr<std::optional<BatchJobStore::KeyedJob>> BatchJobStore::FindJobByIdempotencyKey(
    const std::string& idempotency_key) const {
  absl::MutexLock lock(&mu_);
  Statement find(db_, "SELECT job_id, input_sha256 FROM jobs WHERE idempotency_key = ?");
  if (!find.status().ok()) return find.status();
  find.Bind(1, idempotency_key);
  if (find.Step() != SQLITE_ROW) return std::nullopt;
  return KeyedJob{find.Text(0), find.Blob(1)};
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
  if (absl::Status s = RecordResultsLocked(results, &recorded); !s.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return s;
  }
  if (absl::Status s = Commit(db_); !s.ok()) return s;
  AppendOutputsLocked(results, recorded);
  return recorded;
}

absl::Status BatchJobStore::RecordResultsLocked(const std::vector<Result>& results,
                                                std::vector<bool>* recorded) {
  recorded->assign(results.size(), false);
  Statement find(db_,
                 "SELECT result_seq IS NOT NULL FROM requests WHERE job_id = ? AND "
                 "line_number = ?");
  // The stored request is not needed once the line has its result.
  Statement update(db_,
                   "UPDATE requests SET output = ?, failed = ?, request = NULL, result_seq = "
                   "(SELECT completed + failed + 1 FROM jobs WHERE job_id = ?) "
                   "WHERE job_id = ? AND line_number = ?");
  Statement count_failed(db_,
                         "UPDATE jobs SET failed = failed + 1, generated_tokens = "
                         "generated_tokens + ? WHERE job_id = ?");
  Statement count_completed(db_,
                            "UPDATE jobs SET completed = completed + 1, generated_tokens = "
                            "generated_tokens + ? WHERE job_id = ?");
  for (Statement* s : {&find, &update, &count_failed, &count_completed}) {
    if (!s->status().ok()) return s->status();
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    find.Reset();
    find.Bind(1, r.job_id);
    find.Bind(2, r.line_number);
    if (find.Step() != SQLITE_ROW) {
      return absl::NotFoundError(
          absl::StrCat("job ", r.job_id, " has no request on line ", r.line_number));
    }
    if (find.Int(0) != 0) continue;
    update.Reset();
    update.Bind(1, r.output_line);
    update.Bind(2, static_cast<int64_t>(r.failed));
    update.Bind(3, r.job_id);
    update.Bind(4, r.job_id);
    update.Bind(5, r.line_number);
    if (absl::Status s = StepDone(update, db_); !s.ok()) return s;
    Statement& count = r.failed ? count_failed : count_completed;
    count.Reset();
    count.Bind(1, r.generated_tokens);
    count.Bind(2, r.job_id);
    if (absl::Status s = StepDone(count, db_); !s.ok()) return s;
    (*recorded)[i] = true;
  }
  return absl::OkStatus();
}

void BatchJobStore::AppendOutputsLocked(const std::vector<Result>& results,
                                        const std::vector<bool>& recorded) {
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
  return QueryJobsLocked(absl::StrFormat("WHERE state IN (%d, %d, %d) ORDER BY rowid",
                                         Job::VALIDATING, Job::QUEUED, Job::RUNNING),
                         {});
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

absl::StatusOr<ValidationCursor> BatchJobStore::GetValidationCursor(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  Statement s(db_, "SELECT validated_offset, validated_line, validated FROM jobs WHERE job_id = ?");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  if (s.Step() != SQLITE_ROW) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  return ValidationCursor{s.Int(0), s.Int(1), s.Int(2)};
}

absl::StatusOr<std::vector<int64_t>> BatchJobStore::ClaimCustomIds(
    const std::string& job_id, const std::vector<std::pair<int64_t, std::string>>& lines) {
  std::vector<int64_t> owners;
  owners.reserve(lines.size());
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    Statement claim(db_,
                    "INSERT INTO custom_ids(job_id, custom_id, line_number) VALUES(?, ?, ?) "
                    "ON CONFLICT(job_id, custom_id) DO NOTHING");
    Statement owner(db_, "SELECT line_number FROM custom_ids WHERE job_id = ? AND custom_id = ?");
    if (!claim.status().ok()) return claim.status();
    if (!owner.status().ok()) return owner.status();
    for (const auto& [line, custom_id] : lines) {
      claim.Reset();
      claim.Bind(1, job_id);
      claim.Bind(2, custom_id);
      claim.Bind(3, line);
      if (absl::Status s = StepDone(claim, db_); !s.ok()) return s;
      if (sqlite3_changes(db_) == 1) {
        owners.push_back(line);
        continue;
      }
      owner.Reset();
      owner.Bind(1, job_id);
      owner.Bind(2, custom_id);
      if (owner.Step() != SQLITE_ROW) {
        return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
      }
      owners.push_back(owner.Int(0));
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return status;
  }
  if (absl::Status s = Commit(db_); !s.ok()) return s;
  return owners;
}

absl::Status BatchJobStore::CommitValidated(const std::string& job_id,
                                            const std::vector<ValidatedLine>& lines,
                                            const ValidationCursor& reached) {
  std::vector<Result> errors;
  for (const ValidatedLine& line : lines) {
    if (!line.request.empty()) continue;
    if (line.error_line.find('\n') != std::string::npos) {
      return absl::InvalidArgumentError("an output line must not contain a newline");
    }
    errors.push_back({job_id, line.line_number, line.error_line, /*failed=*/true, 0});
  }
  std::vector<bool> recorded;
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    // A line validated again after a restart keeps its result, if it has one.
    Statement request(db_,
                      "INSERT INTO requests(job_id, line_number, request, reserved_tokens) "
                      "VALUES(?, ?, ?, ?) ON CONFLICT(job_id, line_number) DO UPDATE SET "
                      "request = excluded.request, reserved_tokens = excluded.reserved_tokens "
                      "WHERE result_seq IS NULL");
    Statement row(db_,
                  "INSERT INTO requests(job_id, line_number) VALUES(?, ?) "
                  "ON CONFLICT(job_id, line_number) DO NOTHING");
    Statement cursor(db_,
                     "UPDATE jobs SET validated = ?, validated_offset = ?, validated_line = ?, "
                     "load_attempts = 1 WHERE job_id = ?");
    for (Statement* s : {&request, &row, &cursor}) {
      if (!s->status().ok()) return s->status();
    }
    for (const ValidatedLine& line : lines) {
      Statement& s = line.request.empty() ? row : request;
      s.Reset();
      s.Bind(1, job_id);
      s.Bind(2, line.line_number);
      if (!line.request.empty()) {
        s.BindBlob(3, line.request);
        s.Bind(4, line.reserved_tokens);
      }
      if (absl::Status st = StepDone(s, db_); !st.ok()) return st;
    }
    if (absl::Status s = RecordResultsLocked(errors, &recorded); !s.ok()) return s;
    cursor.Bind(1, reached.validated);
    cursor.Bind(2, reached.offset);
    cursor.Bind(3, reached.next_line);
    cursor.Bind(4, job_id);
    if (absl::Status s = StepDone(cursor, db_); !s.ok()) return s;
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError(absl::StrCat("no job ", job_id));
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return status;
  }
  if (absl::Status s = Commit(db_); !s.ok()) return s;
  AppendOutputsLocked(errors, recorded);
  return absl::OkStatus();
}

absl::Status BatchJobStore::FinishValidation(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec(db_, "BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status status = [&]() -> absl::Status {
    // A job cancelled meanwhile stays CANCELLED.
    Statement state(db_,
                    "UPDATE jobs SET state = ?, load_attempts = 0, validated = total "
                    "WHERE job_id = ? AND state = ?");
    Statement claims(db_, "DELETE FROM custom_ids WHERE job_id = ?");
    if (!state.status().ok()) return state.status();
    if (!claims.status().ok()) return claims.status();
    state.Bind(1, static_cast<int64_t>(Job::QUEUED));
    state.Bind(2, job_id);
    state.Bind(3, static_cast<int64_t>(Job::VALIDATING));
    if (absl::Status s = StepDone(state, db_); !s.ok()) return s;
    claims.Bind(1, job_id);
    return StepDone(claims, db_);
  }();
  if (!status.ok()) {
    (void)Exec(db_, "ROLLBACK");
    return status;
  }
  return Commit(db_);
}

absl::StatusOr<std::vector<PendingRequest>> BatchJobStore::ReadPendingRequests(
    const std::string& job_id, int64_t after_line, int64_t max_lines) const {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT line_number, request FROM requests WHERE job_id = ? AND line_number > ? "
              "AND result_seq IS NULL AND request IS NOT NULL ORDER BY line_number LIMIT ?");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  s.Bind(2, after_line);
  s.Bind(3, max_lines);
  std::vector<PendingRequest> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) out.push_back({s.Int(0), s.Blob(1)});
  if (rc != SQLITE_DONE) return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  return out;
}

absl::StatusOr<std::optional<std::string>> BatchJobStore::ReadPendingRequest(
    const std::string& job_id, int64_t line_number) const {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT request FROM requests WHERE job_id = ? AND line_number = ? "
              "AND result_seq IS NULL AND request IS NOT NULL");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  s.Bind(2, line_number);
  if (s.Step() != SQLITE_ROW) return std::nullopt;
  return s.Blob(0);
}

absl::StatusOr<int64_t> BatchJobStore::ReservedTokensLeft(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT COALESCE(SUM(reserved_tokens), 0) FROM requests WHERE job_id = ? AND "
              "result_seq IS NULL");
  if (!s.status().ok()) return s.status();
  s.Bind(1, job_id);
  if (s.Step() != SQLITE_ROW) {
    return absl::InternalError(absl::StrCat("sqlite: ", sqlite3_errmsg(db_)));
  }
  return s.Int(0);
}

}  // namespace deepinfer

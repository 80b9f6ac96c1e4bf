#include "coordinator/job_validator.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "coordinator/batch/batch_output.h"
#include "coordinator/batch/line_validator.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// Validation runs of one job that may start without getting further (the coordinator dying
// on its input) before the job is given up: the first, and one after a restart, so that a
// coordinator killed by chance during validation costs nothing.
constexpr int64_t kMaxRunsWithoutProgress = 2;

// Waits before trying a write the store refused for want of room again.
constexpr absl::Duration kFirstRetry = absl::Milliseconds(200);
constexpr absl::Duration kMaxRetry = absl::Seconds(5);

// Lines handed to a pool thread at a time.
constexpr size_t kLinesPerBlock = 8;

// A line longer than this is answered with an error line without being read into memory.
constexpr int64_t kMaxLineBytes = int64_t{64} << 20;

struct ChunkLine {
  int64_t line_number = 0;
  absl::string_view text;
  bool too_long = false;
};

// The next chunk of a job's input: its request lines (texts point into `bytes`) and the
// position after them.
struct Chunk {
  std::string bytes;
  std::vector<ChunkLine> lines;
  ValidationCursor after;
  bool end = false;  // the input ends with this chunk
};

absl::Status ReadAt(int fd, int64_t offset, int64_t size, std::string* out,
                    const std::string& path) {
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(size));
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = pread(fd, out->data() + start + done, size - done, offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(
          absl::StrCat("cannot read '", path, "': ", n < 0 ? std::strerror(errno) : "it shrank"));
    }
    done += n;
  }
  return absl::OkStatus();
}

// Skips the line starting at `offset` (longer than kMaxLineBytes): the offset after its
// newline, or the file's size.
absl::StatusOr<int64_t> SkipLine(int fd, int64_t offset, int64_t file_size,
                                 const std::string& path) {
  std::string block;
  while (offset < file_size) {
    block.clear();
    const int64_t size = std::min<int64_t>(int64_t{1} << 20, file_size - offset);
    if (absl::Status s = ReadAt(fd, offset, size, &block, path); !s.ok()) return s;
    const size_t newline = block.find('\n');
    if (newline != std::string::npos) return offset + static_cast<int64_t>(newline) + 1;
    offset += size;
  }
  return file_size;
}

absl::Status ReadChunk(int fd, int64_t file_size, const std::string& path,
                       const ValidationCursor& from, int64_t max_lines, int64_t max_bytes,
                       Chunk* chunk) {
  chunk->bytes.clear();
  chunk->lines.clear();
  chunk->after = from;
  chunk->end = false;
  int64_t offset = from.offset;  // of chunk->bytes[0]
  size_t consumed = 0;           // bytes of complete lines taken
  int64_t line_number = from.next_line;
  std::vector<std::pair<size_t, size_t>> spans;  // request lines' [begin, end) in bytes
  std::vector<int64_t> numbers;
  std::vector<bool> too_long;
  while (static_cast<int64_t>(numbers.size()) < max_lines) {
    const int64_t read_to = offset + static_cast<int64_t>(chunk->bytes.size());
    size_t newline = chunk->bytes.find('\n', consumed);
    if (newline == std::string::npos) {
      const bool eof = read_to >= file_size;
      const bool room = consumed == 0 || static_cast<int64_t>(chunk->bytes.size()) < max_bytes;
      if (!eof && room) {
        if (static_cast<int64_t>(chunk->bytes.size() - consumed) > kMaxLineBytes) {
          // Too long to hold: an error line, and on past its end.
          absl::StatusOr<int64_t> next =
              SkipLine(fd, offset + static_cast<int64_t>(consumed), file_size, path);
          if (!next.ok()) return next.status();
          numbers.push_back(line_number++);
          spans.emplace_back(consumed, consumed);
          too_long.push_back(true);
          chunk->bytes.resize(consumed);
          chunk->after.offset = *next;
          offset = *next - static_cast<int64_t>(consumed);
          if (*next >= file_size) {
            chunk->end = true;
            break;
          }
          continue;
        }
        const int64_t size = std::min<int64_t>(max_bytes, file_size - read_to);
        if (absl::Status s = ReadAt(fd, read_to, size, &chunk->bytes, path); !s.ok()) return s;
        continue;
      }
      if (eof) {
        chunk->end = true;
        if (consumed < chunk->bytes.size()) newline = chunk->bytes.size();  // no final newline
      }
      if (newline == std::string::npos) break;
    }
    const absl::string_view text(chunk->bytes.data() + consumed, newline - consumed);
    if (!absl::StripAsciiWhitespace(text).empty()) {
      numbers.push_back(line_number);
      spans.emplace_back(consumed, newline);
      too_long.push_back(false);
    }
    ++line_number;
    consumed = std::min(newline + 1, chunk->bytes.size());
    if (chunk->end && consumed >= chunk->bytes.size()) break;
  }
  for (size_t i = 0; i < numbers.size(); ++i) {
    chunk->lines.push_back(
        {numbers[i],
         absl::string_view(chunk->bytes.data() + spans[i].first, spans[i].second - spans[i].first),
         too_long[i]});
  }
  chunk->after.offset = offset + static_cast<int64_t>(consumed);
  chunk->after.next_line = line_number;
  chunk->after.validated = from.validated + static_cast<int64_t>(numbers.size());
  if (chunk->after.offset >= file_size) chunk->end = true;
  return absl::OkStatus();
}

}  // namespace

JobValidator::JobValidator(BatchJobStore* store, const PromptBuilder* prompts,
                           JobValidatorConfig config, Callbacks callbacks)
    : store_(store),
      prompts_(prompts),
      config_(std::move(config)),
      callbacks_(std::move(callbacks)) {
  const int threads = config_.threads > 0
                          ? config_.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) pool_.emplace_back([this] { PoolThread(); });
  thread_ = std::thread([this] { Run(); });
}

JobValidator::~JobValidator() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  {
    absl::MutexLock lock(&pool_mu_);
    pool_stop_ = true;
  }
  for (std::thread& t : pool_) t.join();
}

void JobValidator::Enqueue(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(job_id);
}

bool JobValidator::Stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

void JobValidator::Run() {
  for (;;) {
    std::string job_id;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      job_id = std::move(queue_.front());
      queue_.pop_front();
    }
    bool ended = false;
    absl::Status status = Validate(job_id, &ended);
    if (!status.ok()) {
      LOG(ERROR) << "job " << job_id << ": " << status;
      callbacks_.on_done(job_id, status);
    } else if (ended) {
      callbacks_.on_done(job_id, absl::OkStatus());
    }
  }
}

absl::Status JobValidator::UntilThereIsRoom(const std::string& job_id,
                                            const std::function<absl::Status()>& write) {
  absl::Duration delay = kFirstRetry;
  bool stalled = false;
  for (;;) {
    absl::Status status = write();
    if (!absl::IsResourceExhausted(status)) {
      if (stalled && callbacks_.on_stalled) callbacks_.on_stalled(job_id, "");
      if (stalled) LOG(INFO) << "job " << job_id << ": the store takes validation's writes again";
      return status;
    }
    if (!stalled) {
      LOG(WARNING) << "job " << job_id << ": validation waits for room: " << status.message();
      if (callbacks_.on_stalled) {
        callbacks_.on_stalled(
            job_id, absl::StrCat("writes to the state directory fail (", status.message(),
                                 "); validation waits and goes on by itself once there is room"));
      }
      stalled = true;
    }
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), delay);
    }
    delay = std::min(delay * 2, kMaxRetry);
    if (Stopping() || callbacks_.cancelled(job_id)) {
      if (callbacks_.on_stalled) callbacks_.on_stalled(job_id, "");
      return absl::CancelledError("stopped while waiting for room");
    }
  }
}

absl::Status JobValidator::Validate(const std::string& job_id, bool* ended) {
  *ended = false;
  absl::StatusOr<int64_t> runs = store_->StartLoading(job_id);
  if (absl::IsResourceExhausted(runs.status())) runs = 1;  // a full disk: runs, not counted
  if (!runs.ok()) return runs.status();
  if (*runs > kMaxRunsWithoutProgress) {
    return absl::FailedPreconditionError(
        absl::StrCat("a coordinator stopped ", *runs - 1,
                     " times while validating its input (see the coordinator's log); it is not "
                     "validated again"));
  }
  absl::StatusOr<ValidationCursor> cursor = store_->GetValidationCursor(job_id);
  if (!cursor.ok()) return cursor.status();
  const std::string path = store_->InputPath(job_id);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::DataLossError(absl::StrCat("input file of job ", job_id, " is missing"));
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::DataLossError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  const int64_t file_size = st.st_size;
  if (cursor->offset > file_size) {
    return absl::DataLossError(absl::StrCat("input file of job ", job_id, " is shorter (",
                                            file_size, " bytes) than the ", cursor->offset,
                                            " bytes validated before"));
  }
  if (cursor->offset > 0) {
    LOG(INFO) << "job " << job_id << ": validation goes on at line " << cursor->next_line << " ("
              << cursor->validated << " request lines validated before)";
  }
  const LineValidator validator(job_id, prompts_);
  const absl::Time started = absl::Now();
  const int64_t validated_before = cursor->validated;
  int64_t prompt_tokens = 0;
  Chunk chunk;
  std::vector<LineOutcome> outcomes;
  for (;;) {
    if (Stopping() || callbacks_.cancelled(job_id)) return absl::OkStatus();
    if (config_.before_chunk && !config_.before_chunk(job_id)) return absl::OkStatus();
    if (absl::Status s = ReadChunk(fd, file_size, path, *cursor, config_.chunk_lines,
                                   config_.chunk_bytes, &chunk);
        !s.ok()) {
      return s;
    }
    outcomes.assign(chunk.lines.size(), LineOutcome());
    ParallelFor(chunk.lines.size(), [&](size_t i) {
      const ChunkLine& line = chunk.lines[i];
      if (!line.too_long) {
        outcomes[i] = validator.Validate(line.line_number, line.text);
        return;
      }
      outcomes[i].line.line_number = line.line_number;
      outcomes[i].line.error_line = FormatErrorLine(
          "", absl::StrCat(job_id, ":", line.line_number), kInvalidRequest,
          absl::StrCat("line ", line.line_number, ": longer than ", kMaxLineBytes, " bytes"));
    });
    // The first line with a custom id keeps it, across chunks and restarts.
    std::vector<std::pair<int64_t, std::string>> claims;
    std::vector<size_t> claimed_by;
    for (size_t i = 0; i < outcomes.size(); ++i) {
      if (!outcomes[i].claims_custom_id) continue;
      claims.emplace_back(outcomes[i].line.line_number, outcomes[i].custom_id);
      claimed_by.push_back(i);
    }
    absl::StatusOr<std::vector<int64_t>> owners;
    if (absl::Status s = UntilThereIsRoom(job_id,
                                          [&] {
                                            owners = store_->ClaimCustomIds(job_id, claims);
                                            return owners.status();
                                          });
        !s.ok()) {
      return absl::IsCancelled(s) ? absl::OkStatus() : s;
    }
    std::vector<ValidatedLine> lines;
    lines.reserve(outcomes.size());
    for (size_t c = 0; c < claimed_by.size(); ++c) {
      LineOutcome& o = outcomes[claimed_by[c]];
      if ((*owners)[c] == o.line.line_number) continue;
      o.line.error_line = validator.DuplicateCustomId(o, (*owners)[c]);
      o.line.request.clear();
      o.line.reserved_tokens = 0;
    }
    for (LineOutcome& o : outcomes) {
      if (!o.line.request.empty()) prompt_tokens += o.prompt_tokens;
      lines.push_back(std::move(o.line));
    }
    if (absl::Status s = UntilThereIsRoom(
            job_id, [&] { return store_->CommitValidated(job_id, lines, chunk.after); });
        !s.ok()) {
      return absl::IsCancelled(s) ? absl::OkStatus() : s;
    }
    *cursor = chunk.after;
    if (callbacks_.on_progress) callbacks_.on_progress(job_id);
    if (chunk.end) break;
  }
  if (absl::Status s = UntilThereIsRoom(job_id, [&] { return store_->FinishValidation(job_id); });
      !s.ok()) {
    return absl::IsCancelled(s) ? absl::OkStatus() : s;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
  LOG(INFO) << "job " << job_id << ": " << cursor->validated
            << " request lines validated; this run " << cursor->validated - validated_before
            << " lines, " << prompt_tokens << " prompt tokens in "
            << absl::StrFormat("%.2f", seconds) << " s ("
            << absl::StrFormat("%.0f", prompt_tokens / std::max(seconds, 1e-9)) << " tokens/s)";
  *ended = true;
  return absl::OkStatus();
}

void JobValidator::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (pool_.empty() || n <= kLinesPerBlock) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    absl::MutexLock lock(&pool_mu_);
    work_ = &fn;
    work_size_ = n;
    next_ = 0;
    ++batch_;
  }
  for (;;) {
    size_t begin;
    {
      absl::MutexLock lock(&pool_mu_);
      if (next_ >= work_size_) break;
      begin = next_;
      next_ = std::min(work_size_, next_ + kLinesPerBlock);
    }
    for (size_t i = begin; i < std::min(n, begin + kLinesPerBlock); ++i) fn(i);
  }
  absl::MutexLock lock(&pool_mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(pool_mu_) { return busy_ == 0; };
  pool_mu_.Await(absl::Condition(&done));
  work_ = nullptr;
}

void JobValidator::PoolThread() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* fn;
    size_t size;
    {
      absl::MutexLock lock(&pool_mu_);
      auto ready = [this, &seen]() ABSL_SHARED_LOCKS_REQUIRED(pool_mu_) {
        return pool_stop_ || (work_ != nullptr && batch_ != seen);
      };
      pool_mu_.Await(absl::Condition(&ready));
      if (pool_stop_) return;
      seen = batch_;
      fn = work_;
      size = work_size_;
      ++busy_;
    }
    for (;;) {
      size_t begin;
      {
        absl::MutexLock lock(&pool_mu_);
        if (next_ >= work_size_) {
          --busy_;
          break;
        }
        begin = next_;
        next_ = std::min(work_size_, next_ + kLinesPerBlock);
      }
      for (size_t i = begin; i < std::min(size, begin + kLinesPerBlock); ++i) (*fn)(i);
    }
  }
}

}  // namespace deepinfer

#include "coordinator/batch/sqlite_statement.h"

#include <sqlite3.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::sqlite {
namespace {

using ::testing::HasSubstr;

class SqliteStatementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat(::testing::TempDir(), "/sqlite_statement_test.db");
    std::remove(path_.c_str());
    ASSERT_EQ(sqlite3_open(path_.c_str(), &a_), SQLITE_OK);
    ASSERT_EQ(sqlite3_open(path_.c_str(), &b_), SQLITE_OK);
  }
  void TearDown() override {
    sqlite3_close(a_);
    sqlite3_close(b_);
  }
  std::string path_;
  sqlite3* a_ = nullptr;
  sqlite3* b_ = nullptr;
};

TEST_F(SqliteStatementTest, BindStepAndReadBack) {
  ASSERT_TRUE(Exec(a_, "CREATE TABLE t (i INTEGER, s TEXT, b BLOB)").ok());
  Statement insert(a_, "INSERT INTO t VALUES (?, ?, ?)");
  ASSERT_TRUE(insert.status().ok());
  insert.Bind(1, int64_t{42});
  insert.Bind(2, std::string("forty-two"));
  insert.BindBlob(3, std::string("\0\1\2", 3));
  ASSERT_TRUE(StepDone(insert, a_).ok());
  insert.Reset();
  insert.Bind(1, int64_t{7});
  insert.BindNull(2);
  insert.BindNull(3);
  ASSERT_TRUE(StepDone(insert, a_).ok());

  Statement select(a_, "SELECT i, s, b FROM t ORDER BY i");
  ASSERT_EQ(select.Step(), SQLITE_ROW);
  EXPECT_EQ(select.Int(0), 7);
  EXPECT_TRUE(select.IsNull(1));
  EXPECT_EQ(select.Text(1), "");
  ASSERT_EQ(select.Step(), SQLITE_ROW);
  EXPECT_EQ(select.Int(0), 42);
  EXPECT_EQ(select.Text(1), "forty-two");
  EXPECT_EQ(select.Blob(2), std::string("\0\1\2", 3));
  EXPECT_EQ(select.Step(), SQLITE_DONE);
}

TEST_F(SqliteStatementTest, ErrorsNameTheStatementOrTheHolder) {
  Statement bad(a_, "SELEC nothing");
  EXPECT_TRUE(absl::IsInternal(bad.status())) << bad.status();
  absl::Status s = Exec(a_, "CREATE TABLE");
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("in: CREATE TABLE"));

  // b holds a write transaction; a's write finds the database busy.
  ASSERT_TRUE(Exec(a_, "CREATE TABLE t (i INTEGER)").ok());
  ASSERT_TRUE(Exec(b_, "BEGIN IMMEDIATE").ok());
  s = Exec(a_, "INSERT INTO t VALUES (1)");
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("held by another process"));
  ASSERT_TRUE(Commit(b_).ok());
  EXPECT_TRUE(Exec(a_, "INSERT INTO t VALUES (1)").ok());
}

TEST_F(SqliteStatementTest, FailedCommitLeavesNoOpenTransaction) {
  ASSERT_TRUE(Exec(a_, "CREATE TABLE t (i INTEGER)").ok());
  ASSERT_TRUE(Exec(a_, "BEGIN").ok());
  ASSERT_TRUE(Exec(a_, "INSERT INTO t VALUES (1)").ok());
  // b reads inside a transaction, holding a shared lock: a's COMMIT cannot finish.
  ASSERT_TRUE(Exec(b_, "BEGIN").ok());
  Statement read(b_, "SELECT COUNT(*) FROM t");
  ASSERT_EQ(read.Step(), SQLITE_ROW);
  EXPECT_FALSE(Commit(a_).ok());
  EXPECT_NE(sqlite3_get_autocommit(a_), 0) << "the failed COMMIT left the transaction open";
  read.Reset();
  ASSERT_TRUE(Exec(b_, "COMMIT").ok());
  EXPECT_TRUE(Exec(a_, "BEGIN").ok());
}

}  // namespace
}  // namespace deepinfer::sqlite

#include "coordinator/batch/untrusted_json.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ErrorOf(absl::string_view text) {
  absl::StatusOr<nlohmann::ordered_json> parsed = ParseUntrustedJson(text);
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

std::string Nested(int depth, absl::string_view inner = "") {
  return absl::StrCat(std::string(depth, '['), inner, std::string(depth, ']'));
}

TEST(UntrustedJsonTest, ParsesJsonKeepingKeyOrder) {
  auto parsed = ParseUntrustedJson(R"( {"z": 1, "a": [true, null, "x", 2.5, -3], "m": {}} )");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->dump(), R"({"z":1,"a":[true,null,"x",2.5,-3],"m":{}})");
  EXPECT_EQ(ParseUntrustedJson("18446744073709551615")->get<uint64_t>(), 18446744073709551615u);
  EXPECT_EQ(ParseUntrustedJson(R"("\u0000")")->get<std::string>(), std::string(1, '\0'));
}

TEST(UntrustedJsonTest, NulByteIsAnErrorNotTheEnd) {
  // nlohmann's lexer takes a NUL byte for the end of the input and would drop the rest.
  EXPECT_EQ(ErrorOf(std::string("{\"a\": 1}\0{\"b\": 2}", 17)), "a NUL byte at byte 9");
  EXPECT_EQ(ErrorOf(std::string("{\"a\": \"x\0y\"}", 12)), "a NUL byte at byte 9");
}

TEST(UntrustedJsonTest, DataAfterTheValue) {
  EXPECT_THAT(ErrorOf(R"({"a": 1} {"b": 2})"), StartsWith("data after the JSON value, near byte"));
  EXPECT_THAT(ErrorOf(R"({"a": 1}x)"), StartsWith("data after the JSON value"));
  EXPECT_EQ(ErrorOf("{\"a\": 1}  \r\n\t"), "");
}

TEST(UntrustedJsonTest, DepthIsBounded) {
  EXPECT_EQ(ErrorOf(Nested(kMaxJsonDepth)), "");
  const std::string too_deep = absl::StrCat("nested more than ", kMaxJsonDepth,
                                            " levels deep (objects and lists inside each other)");
  EXPECT_EQ(ErrorOf(Nested(kMaxJsonDepth + 1)), too_deep);
  EXPECT_EQ(ErrorOf(Nested(30000)), too_deep);
  EXPECT_EQ(ErrorOf(Nested(100000)), too_deep);
  // Unclosed, and objects.
  EXPECT_EQ(ErrorOf(std::string(100000, '[')), too_deep);
  std::string objects;
  for (int i = 0; i < 1000; ++i) objects += R"({"a":)";
  EXPECT_EQ(ErrorOf(objects), too_deep);
  // Brackets inside strings are text.
  EXPECT_EQ(ErrorOf(absl::StrCat("[\"", std::string(1000, '['), "\"]")), "");
}

TEST(UntrustedJsonTest, DuplicateKeysAreRefused) {
  EXPECT_EQ(ErrorOf(R"({"max_tokens": 5, "x": {}, "max_tokens": 500})"),
            "duplicate key 'max_tokens' in one object");
  // The same key in different objects is fine.
  EXPECT_EQ(ErrorOf(R"({"a": {"k": 1}, "b": {"k": 2}, "k": [{"k": 3}]})"), "");
}

TEST(UntrustedJsonTest, ManyKeysAreReadInLinearTime) {
  // ordered_json's own insertion searches the keys: this object would take minutes.
  std::string text = "{";
  const int n = 200000;
  for (int i = 0; i < n; ++i) absl::StrAppend(&text, i ? "," : "", "\"k", i, "\":", i);
  text += "}";
  auto parsed = ParseUntrustedJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), static_cast<size_t>(n));
  EXPECT_EQ(parsed->begin().key(), "k0");
  EXPECT_EQ((*parsed)["k199999"], 199999);
}

TEST(UntrustedJsonTest, InvalidTextSaysWhere) {
  EXPECT_THAT(ErrorOf("{not json"), StartsWith("not valid JSON near byte 3: "));
  EXPECT_THAT(ErrorOf(""), StartsWith("not valid JSON near byte 1: "));
  EXPECT_THAT(ErrorOf("{\"a\": \"\xff\"}"), HasSubstr("UTF-8"));
  EXPECT_THAT(ErrorOf("\xc0\x80"), StartsWith("not valid JSON near byte 1"));
  EXPECT_THAT(ErrorOf(R"(["\ud800"])"), HasSubstr("surrogate"));
  EXPECT_THAT(ErrorOf(R"({"t": 1e400})"), HasSubstr("number overflow"));
  EXPECT_THAT(ErrorOf(R"({"t": -1e400})"), HasSubstr("number overflow"));
  // The parser quotes the input near the error; a message stays short whatever the input.
  const std::string long_bad = absl::StrCat("[\"", std::string(1 << 20, 'a'), "\x01\"]");
  const std::string error = ErrorOf(long_bad);
  EXPECT_THAT(error, StartsWith("not valid JSON"));
  EXPECT_LT(error.size(), 300u);
}

TEST(UntrustedJsonTest, DescribeNeverPrintsAWholeContainer) {
  using json = nlohmann::ordered_json;
  EXPECT_EQ(DescribeJson(json(nullptr)), "null");
  EXPECT_EQ(DescribeJson(json(true)), "true");
  EXPECT_EQ(DescribeJson(json(-7)), "-7");
  EXPECT_EQ(DescribeJson(json(1.5)), "1.5");
  EXPECT_EQ(DescribeJson(json("hi\n")), "\"hi\\n\"");
  EXPECT_EQ(DescribeJson(json(std::string(1000, 'x'))),
            absl::StrCat("\"", std::string(40, 'x'), "...\" (1000 bytes)"));
  EXPECT_EQ(DescribeJson(json::array()), "an empty list");
  EXPECT_EQ(DescribeJson(json::array({json::array({1}), 2})), "a list of 2 items");
  EXPECT_EQ(DescribeJson(json::object()), "an empty object");
  EXPECT_EQ(DescribeJson(json{{"a", 1}}), "an object of 1 keys");
  // A cut never splits a UTF-8 sequence, and bytes that are not UTF-8 become U+FFFD.
  EXPECT_EQ(DescribeJson(json(std::string(39, 'x') + "é" + std::string(10, 'y'))),
            absl::StrCat("\"", std::string(39, 'x'), "...\" (51 bytes)"));
  EXPECT_EQ(QuoteForMessage("a\xff"
                            "b"),
            "'a\xef\xbf\xbd"
            "b'");
  EXPECT_EQ(QuoteForMessage(std::string(100, 'k')),
            absl::StrCat("'", std::string(40, 'k'), "...'"));
}

}  // namespace
}  // namespace deepinfer

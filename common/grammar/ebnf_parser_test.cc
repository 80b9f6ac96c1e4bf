#include "common/grammar/ebnf_parser.h"

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> CompileEbnf(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::string CompileError(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  if (!g.ok()) return std::string(g.status().message());
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(EbnfParserTest, ArithmeticExpressions) {
  auto g = CompileEbnf(R"g(
    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= factor (("*" | "/") factor)*
    factor ::= number | "(" expr ")"
    number ::= [0-9]+
  )g");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"1", "12+3", "(1+2)*3", "((4))", "1*2/3-4+5"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"", "+", "1+", "(1", "1)", "a", "1 + 2", "()"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(EbnfParserTest, QuantifiersClassesAndEscapes) {
  auto g =
      CompileEbnf(R"g(root ::= "a"{2,3} [^x\n]? 'q\'' "\x41\u00e9" [\u0100-\u0101]{1,} "z"? # c)g");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "aaq'A\xC3\xA9\xC4\x80"));
  EXPECT_TRUE(Matches(g, "aaayq'A\xC3\xA9\xC4\x81\xC4\x80z"));
  EXPECT_FALSE(Matches(g, "aq'A\xC3\xA9\xC4\x80"));      // one 'a'
  EXPECT_FALSE(Matches(g, "aaaaaq'A\xC3\xA9\xC4\x80"));  // five: at most 3 + 1 from the class
  EXPECT_FALSE(Matches(g, "aaxq'A\xC3\xA9\xC4\x80"));    // x is excluded
  EXPECT_FALSE(Matches(g, "aaq'A\xC3\xA9"));             // no \u0100-\u0101
  EXPECT_FALSE(Matches(g, "aaq'A\xC3\xA9\xC4\x82"));     // U+0102
  EXPECT_TRUE(Matches(g,
                      "aa\xE4\xB8\xAD"
                      "q'A\xC3\xA9\xC4\x80"));  // a 3-byte char in [^x\n]
}

TEST(EbnfParserTest, LarkStyle) {
  auto g = CompileEbnf(R"g(
    start: pair ("," pair)*
    ?pair: KEY "=" VALUE
    KEY: /[a-z]+/
    VALUE: /\d+(\.\d+)?/
  )g");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "a=1,bc=2.5"));
  EXPECT_FALSE(Matches(g, "a=1,"));
  EXPECT_FALSE(Matches(g, "A=1"));
  EXPECT_FALSE(Matches(g, "a=1."));
}

TEST(EbnfParserTest, NullableAndNestedRepetition) {
  auto g = CompileEbnf(R"g(
    root ::= item* "."
    item ::= ws? "x" | ws
    ws ::= " "*
  )g");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(Matches(g, "."));
  EXPECT_TRUE(Matches(g, "  x x  x."));
  EXPECT_FALSE(Matches(g, "y."));
}

TEST(EbnfParserTest, Errors) {
  EXPECT_THAT(CompileError("root ::= foo"),
              HasSubstr("rule 'foo' is referenced but never defined"));
  EXPECT_THAT(CompileError("foo ::= \"a\""), HasSubstr("no rule named 'root'"));
  EXPECT_THAT(CompileError("root ::= root \"a\" | \"b\""),
              HasSubstr("rule 'root' is left-recursive"));
  EXPECT_THAT(CompileError("root ::= \"a\" root"), HasSubstr("rule 'root' can never complete"));
  EXPECT_THAT(CompileError("root ::= \"a"), HasSubstr("line 1: unterminated string literal"));
  EXPECT_THAT(CompileError("root ::= \"a\"\nroot ::= \"b\""),
              HasSubstr("line 2: rule 'root' is defined twice"));
  EXPECT_THAT(CompileError("%import common.WS\nroot ::= \"a\""),
              HasSubstr("directive '%import' is not supported"));
  EXPECT_THAT(CompileError("root ::= \"a\"{3,2}"), HasSubstr("n < m"));
  EXPECT_THAT(CompileError("root ::= (\"a\""), HasSubstr("unclosed '('"));
  EXPECT_THAT(CompileError("root ::= [b-a]"), HasSubstr("out of order"));
  EXPECT_THAT(CompileError(""), HasSubstr("empty"));
  EXPECT_THAT(CompileError("root ::= \"a\"" + std::string(100000, '?')),
              HasSubstr("more than 4 quantifiers in a row"));
  EXPECT_THAT(CompileError("root ::= " + std::string(100000, '(') + "\"a\""),
              HasSubstr("nested too deeply"));
  std::string many = "root ::= r0\n";
  for (int i = 0; i < 5000; ++i)
    many += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  many += "r5000 ::= \"x\"\n";
  EXPECT_THAT(CompileError(many), HasSubstr("at most 4000 are supported"));
}

}  // namespace
}  // namespace deepinfer::grammar

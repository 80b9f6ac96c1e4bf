#include "tokenizer/jinja/lexer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer::jinja {
namespace {

using ::testing::ElementsAre;

// Tokens as "type:text" with T=text, {%, %}, {{, }}, N=name, I=integer, F=float, S=string,
// Y=symbol.
std::vector<std::string> Lex(const std::string& source) {
  auto tokens = Tokenize(source);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  std::vector<std::string> out;
  for (const Token& token : *tokens) {
    switch (token.type) {
      case Token::Type::kText:
        out.push_back("T:" + token.text);
        break;
      case Token::Type::kOpenStatement:
      case Token::Type::kCloseStatement:
      case Token::Type::kOpenExpression:
      case Token::Type::kCloseExpression:
        out.push_back(token.text);
        break;
      case Token::Type::kName:
        out.push_back("N:" + token.text);
        break;
      case Token::Type::kInteger:
        out.push_back("I:" + token.text);
        break;
      case Token::Type::kFloat:
        out.push_back("F:" + token.text);
        break;
      case Token::Type::kString:
        out.push_back("S:" + token.text);
        break;
      case Token::Type::kSymbol:
        out.push_back("Y:" + token.text);
        break;
    }
  }
  return out;
}

TEST(LexerTest, TokensOfTagsAndExpressions) {
  EXPECT_THAT(Lex("a{{ x.y[0] | f(1.5, 'q\\n') }}b"),
              ElementsAre("T:a", "{{", "N:x", "Y:.", "N:y", "Y:[", "I:0", "Y:]", "Y:|", "N:f",
                          "Y:(", "F:1.5", "Y:,", "S:q\n", "Y:)", "}}", "T:b"));
  EXPECT_THAT(Lex("{% if a // 2 == 1 %}"),
              ElementsAre("{%", "N:if", "N:a", "Y://", "I:2", "Y:==", "I:1", "%}"));
  // A dict literal's closing braces are not the end of the expression.
  EXPECT_THAT(Lex("{{ {'a': {}} }}"),
              ElementsAre("{{", "Y:{", "S:a", "Y::", "Y:{", "Y:}", "Y:}", "}}"));
}

TEST(LexerTest, WhitespaceControlCommentsAndBlockTrimming) {
  EXPECT_THAT(Lex("a \n {%- x -%} \n b"), ElementsAre("T:a", "{%", "N:x", "%}", "T:b"));
  EXPECT_THAT(Lex("a {#- c -#} b"), ElementsAre("T:a", "T:b"));
  // lstrip_blocks + trim_blocks, and the final newline dropped.
  EXPECT_THAT(Lex("a\n  {% x %}\nb\n"), ElementsAre("T:a\n", "{%", "N:x", "%}", "T:b"));
  EXPECT_THAT(Lex("a\n  {{ x }}\nb"), ElementsAre("T:a\n  ", "{{", "N:x", "}}", "T:\nb"));
}

TEST(LexerTest, Errors) {
  EXPECT_FALSE(Tokenize("{{ 'open }}").ok());
  EXPECT_FALSE(Tokenize("{{ x ").ok());
  EXPECT_FALSE(Tokenize("{# never closed").ok());
  EXPECT_FALSE(Tokenize("{{ a ; b }}").ok());
  EXPECT_FALSE(Tokenize("{{ '\\q' }}").ok());
}

}  // namespace
}  // namespace deepinfer::tokenizer::jinja

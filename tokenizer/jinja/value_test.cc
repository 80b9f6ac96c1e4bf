#include "tokenizer/jinja/value.h"

#include "gtest/gtest.h"

namespace deepinfer::tokenizer::jinja {
namespace {

TEST(ValueTest, PrintsLikeTheReference) {
  EXPECT_EQ(Value().ToString(), "");
  EXPECT_EQ(Value::None().ToString(), "");
  EXPECT_EQ(Value::Bool(true).ToString(), "true");
  EXPECT_EQ(Value::Int(-3).ToString(), "-3");
  EXPECT_EQ(Value::Float(2).ToString(), "2.0");
  EXPECT_EQ(Value::Float(0.1).ToString(), "0.1");
  EXPECT_EQ(FormatFloat(0.30000000000000004), "0.30000000000000004");
  EXPECT_EQ(Value::NewArray({Value::Int(1), Value::String("a"), Value::None()}).ToString(),
            "[1, \"a\", null]");
}

TEST(ValueTest, JsonKeepsKeyOrderAndNonAscii) {
  const Value value = Value::FromJson(
      nlohmann::ordered_json::parse(R"({"z": 1, "a": ["é\n", true, 1.5], "m": {}})"));
  EXPECT_EQ(*value.ToJson(), R"({"z": 1, "a": ["é\n", true, 1.5], "m": {}})");
  EXPECT_EQ(*value.ToJson(2),
            "{\n  \"z\": 1,\n  \"a\": [\n    \"é\\n\",\n    true,\n    1.5\n  ],\n"
            "  \"m\": {}\n}");
  EXPECT_FALSE(Value::NewFunction(nullptr).ToJson().ok());
}

TEST(ValueTest, ObjectsAreSharedSoNamespacesCanBeAssigned) {
  const Value object = Value::NewObject({{"x", Value::Int(1)}});
  const Value alias = object;
  alias.Set("x", Value::Int(2));
  alias.Set("y", Value::Int(3));
  ASSERT_NE(object.Find("x"), nullptr);
  EXPECT_EQ(object.Find("x")->int_value(), 2);
  EXPECT_EQ(object.Find("y")->int_value(), 3);
  EXPECT_EQ(object.Find("missing"), nullptr);
}

TEST(ValueTest, TruthinessAndEquality) {
  EXPECT_FALSE(Value().Truthy());
  EXPECT_FALSE(Value::String("").Truthy());
  EXPECT_TRUE(Value::NewArray({Value::Int(0)}).Truthy());
  EXPECT_FALSE(Value::NewObject().Truthy());
  EXPECT_TRUE(Value::Int(1).Equals(Value::Float(1.0)));
  EXPECT_FALSE(Value::Int(1).Equals(Value::String("1")));
}

}  // namespace
}  // namespace deepinfer::tokenizer::jinja

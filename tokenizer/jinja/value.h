// The values a Jinja template computes with. Semantics follow @huggingface/jinja (the renderer
// transformers.js uses, and our reference): arrays and objects are shared by reference (so
// namespace attributes can be assigned), objects keep insertion order, none and undefined
// print as "", booleans as true/false, floats with a ".0" when integral.
#ifndef TOKENIZER_JINJA_VALUE_H_
#define TOKENIZER_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer::jinja {

class Value;

// Positional and keyword arguments of a call.
struct CallArguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<absl::StatusOr<Value>(const CallArguments&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, few keys

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value NewArray(Array items = {});
  static Value NewObject(Object items = {});
  static Value NewFunction(Function function);
  static Value FromJson(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double number() const { return kind_ == Kind::kInt ? static_cast<double>(int_) : float_; }
  const std::string& string_value() const { return *string_; }
  Array& array() const { return *array_; }
  Object& object() const { return *object_; }
  const Function& function() const { return *function_; }

  // Object member or nullptr.
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value) const;

  bool Truthy() const;
  // How {{ value }} prints.
  std::string ToString() const;
  // JSON text as the tojson filter writes it (", " and ": " separators, non-ASCII kept).
  // `indent` < 0 means single line.
  absl::StatusOr<std::string> ToJson(int indent = -1) const;
  std::string TypeName() const;

  bool Equals(const Value& other) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<Function> function_;
};

// Shortest decimal that reads back as `d`, ".0" appended when integral (JS/Python style).
std::string FormatFloat(double d);

}  // namespace deepinfer::tokenizer::jinja

#endif  // TOKENIZER_JINJA_VALUE_H_

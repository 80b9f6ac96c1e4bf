#include "tokenizer/jinja/value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::tokenizer::jinja {
namespace {

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          *out += buffer;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& value, int indent, int depth, std::string* out) {
  const std::string newline =
      indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * (depth + 1), ' ');
  const std::string close =
      indent < 0 ? "" : "\n" + std::string(static_cast<size_t>(indent) * depth, ' ');
  const char* separator = indent < 0 ? ", " : ",";
  switch (value.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += value.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(value.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat:
      *out += FormatFloat(value.number());
      return absl::OkStatus();
    case Value::Kind::kString:
      AppendJsonString(value.string_value(), out);
      return absl::OkStatus();
    case Value::Kind::kArray: {
      *out += "[";
      bool first = true;
      for (const Value& item : value.array()) {
        if (!first) *out += separator;
        *out += newline;
        first = false;
        absl::Status status = AppendJson(item, indent, depth + 1, out);
        if (!status.ok()) return status;
      }
      if (!value.array().empty()) *out += close;
      *out += "]";
      return absl::OkStatus();
    }
    case Value::Kind::kObject: {
      *out += "{";
      bool first = true;
      for (const auto& [key, item] : value.object()) {
        if (!first) *out += separator;
        *out += newline;
        first = false;
        AppendJsonString(key, out);
        *out += ": ";
        absl::Status status = AppendJson(item, indent, depth + 1, out);
        if (!status.ok()) return status;
      }
      if (!value.object().empty()) *out += close;
      *out += "}";
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot convert ", value.TypeName(), " to JSON"));
  }
}

}  // namespace

std::string FormatFloat(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buffer[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, d);
    if (std::strtod(buffer, nullptr) == d) break;
  }
  std::string text = buffer;
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::NewArray(Array items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = std::make_shared<Array>(std::move(items));
  return v;
}
Value Value::NewObject(Object items) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::make_shared<Object>(std::move(items));
  return v;
}
Value Value::NewFunction(Function function) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.function_ = std::make_shared<Function>(std::move(function));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array items;
      for (const auto& item : json) items.push_back(FromJson(item));
      return NewArray(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object items;
      for (const auto& [key, item] : json.items()) items.emplace_back(key, FromJson(item));
      return NewObject(std::move(items));
    }
    default:
      return Value();
  }
}

const Value* Value::Find(const std::string& key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const auto& entry : *object_) {
    if (entry.first == key) return &entry.second;
  }
  return nullptr;
}

void Value::Set(const std::string& key, Value value) const {
  for (auto& entry : *object_) {
    if (entry.first == key) {
      entry.second = std::move(value);
      return;
    }
  }
  object_->emplace_back(key, std::move(value));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !string_->empty();
    case Kind::kArray:
      return !array_->empty();
    case Kind::kObject:
      return !object_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return "";
    case Kind::kBool:
      return bool_ ? "true" : "false";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return FormatFloat(float_);
    case Kind::kString:
      return *string_;
    case Kind::kFunction:
      return "<function>";
    default: {
      auto json = ToJson();
      return json.ok() ? *json : "";
    }
  }
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  absl::Status status = AppendJson(*this, indent, 0, &out);
  if (!status.ok()) return status;
  return out;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "object";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) return number() == other.number();
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return bool_ == other.bool_;
    case Kind::kString:
      return *string_ == *other.string_;
    case Kind::kArray: {
      if (array_->size() != other.array_->size()) return false;
      for (size_t i = 0; i < array_->size(); ++i) {
        if (!(*array_)[i].Equals((*other.array_)[i])) return false;
      }
      return true;
    }
    case Kind::kObject:
      return object_ == other.object_;
    default:
      return false;
  }
}

}  // namespace deepinfer::tokenizer::jinja

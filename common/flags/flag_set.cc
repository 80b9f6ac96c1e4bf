#include "common/flags/flag_set.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

std::string Quote(const std::string& s) { return absl::StrCat("\"", s, "\""); }

}  // namespace

FlagSet::FlagSet(std::string usage, std::string description)
    : usage_(std::move(usage)), description_(std::move(description)) {}

void FlagSet::AddString(const std::string& name, std::string* value, const std::string& help) {
  CHECK(Find(name) == nullptr) << "flag --" << name << " declared twice";
  flags_.push_back({name, value, help, Quote(*value)});
}

void FlagSet::AddInt(const std::string& name, int64_t* value, const std::string& help) {
  CHECK(Find(name) == nullptr) << "flag --" << name << " declared twice";
  flags_.push_back({name, value, help, absl::StrCat(*value)});
}

void FlagSet::AddDouble(const std::string& name, double* value, const std::string& help) {
  CHECK(Find(name) == nullptr) << "flag --" << name << " declared twice";
  flags_.push_back({name, value, help, absl::StrCat(*value)});
}

void FlagSet::AddBool(const std::string& name, bool* value, const std::string& help) {
  CHECK(Find(name) == nullptr) << "flag --" << name << " declared twice";
  flags_.push_back({name, value, help, *value ? "true" : "false"});
}

void FlagSet::Require(const std::string& name) {
  Flag* flag = Find(name);
  CHECK(flag != nullptr) << "Require of undeclared flag --" << name;
  flag->required = true;
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status FlagSet::Set(Flag& flag, const std::string& text) {
  flag.seen = true;
  if (auto* s = std::get_if<std::string*>(&flag.value)) {
    **s = text;
    return absl::OkStatus();
  }
  if (auto* i = std::get_if<int64_t*>(&flag.value)) {
    if (!absl::SimpleAtoi(text, *i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, " expects an integer, got '", text, "'"));
    }
    return absl::OkStatus();
  }
  if (auto* d = std::get_if<double*>(&flag.value)) {
    if (!absl::SimpleAtod(text, *d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, " expects a number, got '", text, "'"));
    }
    return absl::OkStatus();
  }
  bool* b = std::get<bool*>(flag.value);
  if (text == "true" || text == "1" || text == "yes") {
    *b = true;
  } else if (text == "false" || text == "0" || text == "no") {
    *b = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag.name, " expects true or false, got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (arg == "--") {
      positional_.insert(positional_.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    // Accept --snake_case spellings of --kebab-case flags.
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    Flag* flag = Find(name);
    if (flag == nullptr && !has_value && name.rfind("no", 0) == 0) {
      // --noNAME and --no-NAME.
      Flag* negated = Find(name.substr(name.rfind("no-", 0) == 0 ? 3 : 2));
      if (negated != nullptr && std::holds_alternative<bool*>(negated->value)) {
        *std::get<bool*>(negated->value) = false;
        negated->seen = true;
        continue;
      }
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see --help for the flags of this command)"));
    }
    if (!has_value) {
      if (std::holds_alternative<bool*>(flag->value)) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    if (absl::Status s = Set(*flag, value); !s.ok()) return s;
  }
  std::vector<std::string> missing;
  for (const Flag& f : flags_) {
    if (f.required && !f.seen) missing.push_back("--" + f.name);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("missing required flag", missing.size() > 1 ? "s " : " ",
                     absl::StrJoin(missing, ", "), " (see --help)"));
  }
  return absl::OkStatus();
}

int FlagSet::ParseMain(int argc, char** argv, const std::string& program,
                       size_t max_positional) {
  absl::Status parsed = Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (help_requested_) {
    std::cout << Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << program << ": " << parsed.message() << "\n";
    return 2;
  }
  if (positional_.size() > max_positional) {
    std::cerr << program << ": unexpected argument '" << positional_[max_positional]
              << "' (see --help)\n";
    return 2;
  }
  return -1;
}

std::string FlagSet::Help() const {
  std::string out = absl::StrCat("Usage: ", usage_, "\n\n");
  if (!description_.empty()) absl::StrAppend(&out, description_, "\n\n");
  if (flags_.empty()) return out;
  absl::StrAppend(&out, "Flags:\n");
  for (const Flag& f : flags_) {
    const char* kind = std::holds_alternative<bool*>(f.value)     ? ""
                       : std::holds_alternative<int64_t*>(f.value) ? "=N"
                       : std::holds_alternative<double*>(f.value)  ? "=X"
                                                                   : "=VALUE";
    absl::StrAppend(&out, "  --", f.name, kind);
    if (f.required) {
      absl::StrAppend(&out, "  (required)\n");
    } else {
      absl::StrAppend(&out, "  (default: ", f.default_text, ")\n");
    }
    for (absl::string_view line : absl::StrSplit(f.help, '\n')) {
      absl::StrAppend(&out, "      ", line, "\n");
    }
  }
  return out;
}

}  // namespace deepinfer

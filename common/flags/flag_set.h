// FlagSet: the command-line flags of one binary or one subcommand, with help text.
//
// Flags are declared in a binary's main.cc and bound to fields of its config struct;
// the field's value before parsing is the default shown in --help. Accepted forms:
// --name=value, --name value, and for booleans --name, --name=true|false, --noname, --no-name.
// Anything not starting with "--" is a positional argument. Why not absl flags:
// subcommands need their own flag namespaces and their own --help.
#ifndef DEEPINFER_COMMON_FLAGS_FLAG_SET_H_
#define DEEPINFER_COMMON_FLAGS_FLAG_SET_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace deepinfer {

class FlagSet {
 public:
  // `usage` is the first help line ("deepinfer-admin status [flags]"); `description`
  // the paragraph under it.
  FlagSet(std::string usage, std::string description);

  void AddString(const std::string& name, std::string* value, const std::string& help);
  void AddInt(const std::string& name, int64_t* value, const std::string& help);
  void AddDouble(const std::string& name, double* value, const std::string& help);
  void AddBool(const std::string& name, bool* value, const std::string& help);
  // Marks a flag as required: Parse fails when it is absent.
  void Require(const std::string& name);

  // Parses `args` (without the program or subcommand name). INVALID_ARGUMENT names
  // the offending flag and says what was expected. "--help"/"-h" stops parsing and
  // sets help_requested() without checking required flags.
  absl::Status Parse(const std::vector<std::string>& args);

  // For a binary's main: parses argv[1..argc); prints the help (returns 0) or the error
  // prefixed with `program` (returns 2, also for more than `max_positional` arguments);
  // returns -1 when main should go on.
  int ParseMain(int argc, char** argv, const std::string& program, size_t max_positional = 0);

  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }
  // Usage line, description, and every flag with its default and help.
  std::string Help() const;

 private:
  struct Flag {
    std::string name;
    std::variant<std::string*, int64_t*, double*, bool*> value;
    std::string help;
    std::string default_text;
    bool required = false;
    bool seen = false;
  };
  Flag* Find(const std::string& name);
  absl::Status Set(Flag& flag, const std::string& text);

  std::string usage_;
  std::string description_;
  std::vector<Flag> flags_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_FLAGS_FLAG_SET_H_

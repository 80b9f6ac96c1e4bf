// Dispatch for binaries with subcommands ("deepinfer run ...", "deepinfer-admin
// status ..."): picks the subcommand from argv[1], prints the command list for
// --help / help / no arguments, and a readable error for an unknown command.
#ifndef DEEPINFER_COORDINATOR_CLI_SUBCOMMANDS_H_
#define DEEPINFER_COORDINATOR_CLI_SUBCOMMANDS_H_

#include <functional>
#include <string>
#include <vector>

namespace deepinfer {

struct Subcommand {
  std::string name;
  std::string summary;  // one line, for the command list
  // Receives the arguments after the subcommand name; returns the exit code.
  std::function<int(const std::vector<std::string>& args)> run;
};

// Returns the process exit code: the subcommand's, 0 for help, 2 for usage errors.
int RunSubcommands(const std::string& program, const std::string& description,
                   const std::vector<Subcommand>& commands, int argc, char** argv);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_SUBCOMMANDS_H_

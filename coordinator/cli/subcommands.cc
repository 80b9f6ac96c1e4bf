#include "coordinator/cli/subcommands.h"

#include <iostream>

namespace deepinfer {
namespace {

void PrintCommandList(const std::string& program, const std::string& description,
                      const std::vector<Subcommand>& commands, std::ostream& out) {
  out << "Usage: " << program << " COMMAND [flags]\n\n" << description << "\n\nCommands:\n";
  size_t width = 0;
  for (const Subcommand& c : commands) width = std::max(width, c.name.size());
  for (const Subcommand& c : commands) {
    out << "  " << c.name << std::string(width - c.name.size() + 3, ' ') << c.summary << "\n";
  }
  out << "\nRun '" << program << " COMMAND --help' for the flags of a command.\n";
}

}  // namespace

int RunSubcommands(const std::string& program, const std::string& description,
                   const std::vector<Subcommand>& commands, int argc, char** argv) {
  if (argc < 2) {
    PrintCommandList(program, description, commands, std::cerr);
    return 2;
  }
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "--help" || name == "-h" || name == "help") {
    if (name == "help" && !args.empty()) {
      // "help CMD" is "CMD --help".
      name = args[0];
      args = {"--help"};
    } else {
      PrintCommandList(program, description, commands, std::cout);
      return 0;
    }
  }
  for (const Subcommand& c : commands) {
    if (c.name == name) return c.run(args);
  }
  std::cerr << program << ": unknown command '" << name << "'. Commands:";
  for (const Subcommand& c : commands) std::cerr << " " << c.name;
  std::cerr << "\n";
  return 2;
}

}  // namespace deepinfer

// deepinfer: the user's command-line tool. Subcommands are listed by `deepinfer help`.
#include <iostream>
#include <string>
#include <vector>

#include "coordinator/cli/flag_set.h"
#include "coordinator/cli/subcommands.h"
#include "worker/device_discovery.h"

namespace deepinfer {
namespace {

int Devices(const std::vector<std::string>& args) {
  std::string selection_text = "auto";
  FlagSet flags("deepinfer devices [--devices auto|cpu|cuda]",
                "Lists the devices a worker on this machine would use, as\n"
                "`deepinfer-worker --devices` would pick them.");
  flags.AddString("devices", &selection_text,
                  "auto: every CUDA GPU, else the CPU; cpu: the CPU only;\n"
                  "cuda: CUDA GPUs, an error if there are none.");
  absl::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "deepinfer devices: " << parsed.message() << "\n";
    return 2;
  }
  absl::StatusOr<DeviceSelection> selection = ParseDeviceSelection(selection_text);
  if (!selection.ok()) {
    std::cerr << "deepinfer devices: --devices: " << selection.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<Device>> devices = FindDevices(*selection);
  if (!devices.ok()) {
    std::cerr << "deepinfer devices: " << devices.status().message() << "\n";
    return 1;
  }
  for (const Device& d : *devices) {
    std::cout << Device::Kind_Name(d.kind()) << ":" << d.index() << "  " << d.name() << "  "
              << d.total_memory_bytes() / (1 << 20) << " MiB";
    if (!d.compute_capability().empty()) std::cout << "  sm " << d.compute_capability();
    std::cout << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  return deepinfer::RunSubcommands(
      "deepinfer",
      "deepinfer: batch inference for DeepSeek-family MoE models.\n"
      "Cluster daemons: deepinfer-coordinator, deepinfer-worker; operator tool: deepinfer-admin.",
      {
          {"devices", "list the devices a worker on this machine would use", deepinfer::Devices},
      },
      argc, argv);
}

// Programs of their own that `tilejit` runs for a command: `tilejit export ARGS` runs
// `tilejit-export ARGS` (the exporter links LLVM, ~115 MB, which the `tilejit` program, libtilejit
// and the machines that only run kernels do without), and `tilejit bench ring ARGS` runs
// `tilejit-ring ARGS` (it links NCCL).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace tj::tools {

namespace {

// Replaces this process by `program` from the directory of the running one (else from $PATH).
int exec_sibling(const std::string& program, const std::vector<std::string>& args, const std::string& needs) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::filesystem::path exe = ec ? std::filesystem::path(program) : self.parent_path() / program;
  std::vector<std::string> storage{exe.string()};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  argv.push_back(nullptr);
  ::execv(exe.c_str(), argv.data());
  std::cerr << "tilejit: cannot run " << exe.string() << " (" << std::strerror(errno) << "); " << needs << "\n";
  return 1;
}

}  // namespace

int export_forward(const std::vector<std::string>& args) {
  return exec_sibling("tilejit-export", args,
                      "`tilejit export` needs the tilejit-export program, built when LLVM 15 is found (llvm-15-dev; see "
                      "scripts/setup.sh)");
}

int ring_forward(const std::vector<std::string>& args) {
  return exec_sibling("tilejit-ring", args,
                      "`tilejit bench ring` needs the tilejit-ring program, built when NCCL is found (nccl.h and libnccl, "
                      "the CUDA toolkit's)");
}

}  // namespace tj::tools

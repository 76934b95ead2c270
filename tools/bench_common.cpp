// The plumbing `tilejit bench attention` and `tilejit bench variants` share (tools/attention.h):
// compiling ahead, one measured implementation, the peers' script as a subprocess, the --out
// file.
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "runtime/driver.h"
#include "core/error.h"
#include "autotune/launch.h"
#include "runtime/jit.h"
#include "tools/attention.h"

extern char** environ;

namespace tj::tools {

namespace fs = std::filesystem;

void precompile(const std::vector<CompileJob>& jobs, const std::string& arch) {
  std::atomic<size_t> next{0};
  std::atomic<int> failed{0};
  std::string first_error;
  std::mutex error_mutex;
  const size_t threads = std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), jobs.size()));
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < jobs.size();) {
        try {
          compile(*jobs[i].kernel, jobs[i].specs, jobs[i].config, CompileRequest{arch, false, /*load=*/false});
        } catch (const std::exception& e) {
          ++failed;
          std::lock_guard lock(error_mutex);
          if (first_error.empty()) first_error = e.what();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (failed) fmt::print("note: {} of {} kernels did not compile ahead (the timing loop reports it): {}\n", failed.load(),
                         jobs.size(), first_error);
}

std::string config_brief(const Config& c) {
  std::string s;
  for (const auto& [k, v] : c.blocks) s += fmt::format("{}{} ", k, v);
  s += fmt::format("s{} w{}", c.num_stages, c.num_warps);
  for (const auto& [k, v] : c.knobs) s += fmt::format(" {}={}", k, v);
  return s;
}

BenchResult measure(const std::function<void()>& fn, DeviceTensor& out, std::optional<HostTensor>* output, double flops,
                    CUstream stream, int reps, int warmup, L2Flusher& l2) {
  out.fill_bytes(0xFF);   // NaN: whatever the kernel does not write shows in the check
  fn();
  runtime::synchronize();
  if (output) output->emplace(out.to_host());
  const Timing t = time_launches(fn, stream, reps, warmup, l2);
  BenchResult r;
  r.ms = t.median_ms;
  r.tflops = tflops(flops, t.median_ms);
  r.note = fmt::format("min {:.4f} max {:.4f} ms", t.min_ms, t.max_ms);
  return r;
}

std::string find_peers_script(const std::string& given, const std::string& default_script) {
  if (!given.empty()) {
    if (!fs::exists(given)) throw Error(fmt::format("--peers-script {}: no such file", given));
    return given;
  }
  std::vector<fs::path> candidates = {default_script};
#ifdef TILEJIT_SOURCE_DIR
  candidates.push_back(fs::path(TILEJIT_SOURCE_DIR) / default_script);
#endif
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back(exe.parent_path() / "../.." / default_script);   // build/tools, .device/bin
  for (const auto& c : candidates)
    if (fs::exists(c, ec)) return c.string();
  return "";
}

int run_subprocess(const std::vector<std::string>& argv) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "PYTHONUNBUFFERED=", 17) != 0) env_store.emplace_back(*e);
  env_store.emplace_back("PYTHONUNBUFFERED=1");   // its progress interleaves with ours in order
  std::vector<char*> args, env;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env_store) env.push_back(e.data());
  env.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), env.data());
  if (rc != 0) throw Error(fmt::format("could not start {}: {}", argv[0], std::strerror(rc)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void run_peers_script(const std::string& python, const std::string& script_option, const std::vector<std::string>& args,
                      const std::string& what, const std::function<void(std::istream&)>& read,
                      std::vector<std::string>& notes, const std::string& default_script) {
  const std::string script = find_peers_script(script_option, default_script);
  if (script.empty()) {
    notes.push_back(fmt::format("peers: {} not found (run from the repository root, or give --peers-script); tilejit rows only",
                                default_script));
    return;
  }
  const fs::path csv = fs::temp_directory_path() / fmt::format("tilejit_peers_{}.csv", ::getpid());
  fs::remove(csv);
  std::vector<std::string> argv = {python, script};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--csv", csv.string()});
  fmt::print("\npeers: {} {} ({})\n", python, script, what);
  int status = 0;
  try {
    status = run_subprocess(argv);
  } catch (const std::exception& e) {
    notes.push_back(fmt::format("peers: {} (no Python here?); tilejit rows only", e.what()));
    return;
  }
  if (status == 127) notes.push_back(fmt::format("peers: '{}' could not be run (exit status 127); tilejit rows only", python));
  else if (status != 0) notes.push_back(fmt::format("peers: {} exited with status {} (its output above says why); "
                                                    "the rows it finished are kept", script, status));
  std::ifstream in(csv);
  if (in) read(in);
  else if (status == 0) notes.push_back("peers: peers.py wrote no CSV; tilejit rows only");
  std::error_code ec;
  fs::remove(csv, ec);
}

void check_out_path(const std::string& out) {
  if (out.empty()) return;
  const fs::path parent = fs::path(out).parent_path();
  if (!parent.empty() && !fs::is_directory(parent)) throw Error(fmt::format("--out {}: no directory '{}'", out, parent.string()));
}

void emit_markdown(const std::string& md, const std::string& out) {
  fmt::print("\n{}", md);
  if (out.empty()) return;
  std::ofstream f(out);
  if (!(f << md)) throw Error(fmt::format("--out {}: could not write", out));
  fmt::print("written to {}\n", out);
}

}  // namespace tj::tools

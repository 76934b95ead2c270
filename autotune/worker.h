#pragma once
// The benchmark worker: where the tuner runs candidates on the GPU.
//
// CUDA state does not survive fork() and a faulting kernel (illegal address, launch failure)
// poisons its context for good, so candidates run in a child process: `tilejit
// __tune-worker --fd N` (fork + exec of the tilejit executable; the child dies with its
// parent). Parent and worker talk over a socket pair in JSON lines, one request and one
// reply at a time (protocol below). When the worker dies or a request exceeds its timeout
// (a hang), the parent kills it, reports the candidate in flight as faulting and starts a
// fresh worker for the rest. The worker is kernel-agnostic: it gets the CUBIN (a disk-cache
// key, or the bytes), the entry point, the launch geometry and the parameter list, so it
// never traces or compiles a candidate.
//
// Requests (parent -> worker) and replies:
//   {"op":"hello"}  -> {"ok":true,"pid":..,"device":{"name","cc_major","cc_minor","arch","driver",
//                       "nvrtc","sm_count","l2_bytes","smem_optin","regs_per_block","threads_per_block",
//                       "total_mem"}}
//   {"op":"setup","params":[{"tensor":true,"dtype":"e4m3","shape":[..],"role":"in|out|inout"} |
//                           {"tensor":false,"value":0.088}], "seed":1}
//       allocates the arguments (random inputs; copies to rotate when they fit in L2)
//       -> {"ok":true,"copies":k,"bytes":..}
//   {"op":"bench","id":7,"cubin_key":".."|"cubin_b64":"..","entry":"..","grid":[x,y,z],"block":[x,y,z],
//    "smem":..,"reference":false,"tolerance":[per output],"best_ms":..,"repeats":10,
//    "max_bench_ms":2000,"early_stop":3,"fault":0}
//       -> {"id":7,"status":"ok|pruned|wrong|hopeless|error|fault","ms":..,"samples":[..],"regs":..,
//           "spill_bytes":..,"max_error":..,"max_ref":..,"nan_mismatch":..,"detail":".."}
//       "fault" means the context is lost: the worker exits after replying.
//       "reference":true stores this candidate's outputs as the reference later candidates
//       are compared with (max |out - ref| <= tolerance * max |ref|, NaN/inf in the same places).
//       "fault" (tests only): 1 launches an illegal-address kernel, 2 a kernel that never ends,
//       3 aborts the worker, instead of the candidate.
//   {"op":"quit"} -> {"ok":true}, then the worker exits.
#include <string>
#include <sys/types.h>

namespace tj::autotune {

// What one call returned: the reply line, or why there is none.
struct WorkerReply {
  bool ok = false;                 // a reply line arrived
  std::string line;                // the reply (JSON) when ok
  bool timed_out = false;          // no reply within the timeout (the worker was killed)
  std::string failure;             // "worker timed out after 5.0 s", "worker killed by signal 6", ...
};

// Where candidates run: a child process (isolated) or this process.
class Bench {
 public:
  virtual ~Bench() = default;
  // Starts the worker if it is not running. Throws tj::Error when it cannot start.
  virtual void start() = 0;
  virtual bool running() const = 0;
  // Sends `request` (one JSON object, no newline) and waits up to `timeout_s` for the reply.
  virtual WorkerReply call(const std::string& request, double timeout_s) = 0;
  // Stops the worker (asks it to quit, kills it if it does not).
  virtual void stop() = 0;
  virtual bool isolated() const = 0;
  // Workers started so far (1 + restarts).
  virtual int starts() const = 0;
};

// A worker process running `executable __tune-worker --fd 3`.
class ProcessBench : public Bench {
 public:
  explicit ProcessBench(std::string executable);
  ~ProcessBench() override;
  void start() override;
  bool running() const override { return pid_ > 0; }
  WorkerReply call(const std::string& request, double timeout_s) override;
  void stop() override;
  bool isolated() const override { return true; }
  int starts() const override { return starts_; }
  pid_t pid() const { return pid_; }

 private:
  // Reaps the child; returns how it ended ("exited with status 3", "killed by signal 9").
  std::string reap(bool kill_first);
  std::string executable_;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buffer_;
  int starts_ = 0;
};

// Runs the worker's request handler in this process: no fault isolation and no timeouts
// (a faulting candidate loses this process's CUDA context). For machines where the
// tilejit executable cannot be found, and for debugging.
class InProcessBench : public Bench {
 public:
  InProcessBench();
  ~InProcessBench() override;
  void start() override;
  bool running() const override { return session_ != nullptr; }
  WorkerReply call(const std::string& request, double timeout_s) override;
  void stop() override;
  bool isolated() const override { return false; }
  int starts() const override { return starts_; }

 private:
  struct Session;
  Session* session_ = nullptr;
  int starts_ = 0;
};

// The tilejit executable to run workers with: $TILEJIT_TUNE_WORKER, this process if it is
// tilejit, else the executable next to the tilejit library (build tree: <build>/tools/tilejit;
// install: <prefix>/bin/tilejit). Empty when none is found.
std::string find_worker_executable();

// The worker's main loop (`tilejit __tune-worker --fd N`): serves requests on fd until EOF
// or quit. Returns the process exit status.
int worker_main(int fd);

// CUDA C++ of the kernels the worker compiles for itself with NVRTC (output comparison,
// fault injection). Exposed so a CPU test can compile them.
const std::string& worker_kernels_source();

}  // namespace tj::autotune

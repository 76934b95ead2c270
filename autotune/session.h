#pragma once
// The worker's request handler (autotune/worker.h describes the protocol). Internal to
// autotune/: the worker process and InProcessBench both drive one of these.
#include <memory>
#include <string>

namespace tj::autotune::detail {

// Either handler behind one interface.
class Session {
 public:
  virtual ~Session() = default;
  // Handles one request line and returns the reply line. Sets `fatal` when the CUDA context
  // is lost (the reply says "fault"); the caller must not send more requests then.
  virtual std::string handle(const std::string& request, bool& fatal, bool& quit) = 0;
};

// The real one: CUDA.
class BenchSession : public Session {
 public:
  BenchSession();
  ~BenchSession() override;
  BenchSession(const BenchSession&) = delete;
  BenchSession& operator=(const BenchSession&) = delete;

  std::string handle(const std::string& request, bool& fatal, bool& quit) override;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// $TILEJIT_TUNE_SIMULATE=1: a worker without a GPU, for testing the tuner's machinery
// (processes, timeouts, restarts, compile pipeline, search, cache) on any machine. It
// reports a simulated sm_90a GPU, checks that each candidate's CUBIN arrived (ELF image),
// and answers with a synthetic time: fastest at blocks of 128 and 8 warps (see
// simulated_ms). Fault injection ("fault" 1/2/3) behaves as in the real worker. A value
// n > 1 makes each benchmark take n milliseconds.
class SimulatedSession : public Session {
 public:
  std::string handle(const std::string& request, bool& fatal, bool& quit) override;
};

// The simulated time of a config (JSON of Config): 0.5 ms x (1 + 0.15 per octave each block is
// away from 128 + 0.1 per octave num_warps is away from 8).
double simulated_ms(const std::string& config_json);

// A fresh session: simulated when $TILEJIT_TUNE_SIMULATE is set (and not "0"), else real.
std::unique_ptr<Session> make_session();

}  // namespace tj::autotune::detail

#include "autotune/tuner.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "autotune/launch_plan.h"
#include "autotune/space.h"
#include "autotune/worker.h"
#include "codegen/cuda_emitter.h"
#include "codegen/knob.h"
#include "codegen/target.h"
#include "runtime/device.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "runtime/hash.h"
#include "runtime/jit.h"
#include "runtime/nvrtc.h"
#include "runtime/reference.h"

namespace tj::autotune {

using nlohmann::json;

std::string_view name(Effort e) {
  switch (e) {
    case Effort::none: return "none";
    case Effort::quick: return "quick";
    case Effort::full: return "full";
    case Effort::exhaustive: return "exhaustive";
  }
  return "?";
}

std::optional<Effort> effort_from_name(std::string_view s) {
  for (Effort e : {Effort::none, Effort::quick, Effort::full, Effort::exhaustive})
    if (name(e) == s) return e;
  return std::nullopt;
}

std::string_view name(Candidate::Status s) {
  using S = Candidate::Status;
  switch (s) {
    case S::ok: return "ok";
    case S::invalid: return "invalid";
    case S::pruned: return "pruned";
    case S::compile_error: return "compile_error";
    case S::wrong: return "wrong";
    case S::fault: return "fault";
    case S::timeout: return "timeout";
    case S::hopeless: return "hopeless";
    case S::duplicate: return "duplicate";
    case S::skipped: return "skipped";
    case S::error: return "error";
  }
  return "?";
}

double output_tolerance(DType out) {
  switch (out) {
    case DType::f32: return 1e-4;
    case DType::f16: return 4e-3;
    case DType::bf16: return 2e-2;
    case DType::e4m3: return 0.13;
    case DType::e5m2: return 0.26;
    default: return 0.0;
  }
}

std::vector<const Candidate*> TuneResult::ranking() const {
  std::vector<const Candidate*> out;
  for (const auto& c : candidates)
    if (c.status == Candidate::Status::ok) out.push_back(&c);
  std::stable_sort(out.begin(), out.end(), [](const Candidate* a, const Candidate* b) { return a->ms < b->ms; });
  return out;
}

namespace {

// The tuner's own knob (tests): the candidate faults on purpose, 1 by an illegal address, 2 by never
// ending, 3 by crashing the process that runs it.
const codegen::KnobSpec kFault{knob_names::fault, 0, "0", "tests: 1 an illegal address, 2 a kernel that never ends, 3 a crash"};
const bool fault_knob_registered = codegen::register_knob_table("tuner", {&kFault});

using clock_type = std::chrono::steady_clock;
using Status = Candidate::Status;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

std::string base64(const std::vector<char>& in) {
  static const char* tbl = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += tbl[(v >> 6) & 63];
    out += tbl[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += tbl[v >> 18];
    out += tbl[(v >> 12) & 63];
    out += i + 1 < in.size() ? tbl[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The generated source without the line that prints the config: two configs that generate
// the same code otherwise are the same kernel.
std::string code_identity(const std::string& source, const Config& c) {
  std::string out;
  out.reserve(source.size());
  size_t pos = 0;
  while (pos < source.size()) {
    size_t nl = source.find('\n', pos);
    size_t end = nl == std::string::npos ? source.size() : nl + 1;
    std::string_view line(source.data() + pos, end - pos);
    if (line.rfind("// config:", 0) != 0) out.append(line);
    pos = end;
  }
  runtime::Hasher h;
  h.field(out).field(std::to_string(c.knob(knob_names::fault, 0)));
  return h.hex();
}

struct DeviceReport {
  DeviceIdentity id;
  int sm_count = 0;
  long long l2_bytes = 0;
  long long smem_optin = 0;
  long long regs_per_block = 0;
  long long threads_per_block = 1024;
};

// A candidate and the tuner's bookkeeping about it.
struct Cand {
  Candidate pub;
  enum class Phase : uint8_t { queued, ready, done } phase = Phase::queued;
  bool submitted = false;
  std::string cubin_key;               // disk-cache key, when the CUBIN is on disk
  std::vector<char> cubin;             // otherwise the bytes
  std::string entry;
  LaunchGeometry geometry;
  std::vector<codegen::TmaOperand> tma;
};

class ProgressLine {
 public:
  ProgressLine(bool enabled, std::string title) : enabled_(enabled), title_(std::move(title)), tty_(::isatty(2) == 1) {}

  void update(int done, int total, double best_ms, double ref_ms, double flops, const std::string& best_cfg, double eta_s,
              bool force = false) {
    if (!enabled_) return;
    const auto now = clock_type::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (tty_ ? (!force && since < 0.1) : (!force && since < 5.0)) return;
    last_ = now;
    std::string best = "best -";
    if (std::isfinite(best_ms)) {
      best = fmt::format("best {:.4g} ms", best_ms);
      if (flops > 0) best += fmt::format(" ({:.3g} TFLOP/s)", flops / (best_ms * 1e-3) / 1e12);
      if (std::isfinite(ref_ms) && ref_ms > 0) best += fmt::format(" x{:.2f} vs default", ref_ms / best_ms);
    }
    const int width = 24;
    const int filled = total > 0 ? std::min(width, done * width / std::max(total, 1)) : 0;
    std::string bar = std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), '.');
    std::string eta = std::isfinite(eta_s) ? fmt::format("ETA {:.0f} s", std::max(0.0, eta_s)) : "ETA -";
    std::string text = fmt::format("{} [{}] {}/{}  {}  {}", title_, bar, done, total, best, eta);
    if (tty_) {
      std::string cfg = best_cfg.size() > 48 ? best_cfg.substr(0, 45) + "..." : best_cfg;
      std::string line = "\r" + text + "  " + cfg + "\033[K";
      std::fputs(line.c_str(), stderr);
      drawn_ = true;
    } else {
      std::string line = text + "  " + best_cfg + "\n";
      std::fputs(line.c_str(), stderr);
    }
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_ && tty_ && drawn_) std::fputs("\n", stderr);
    drawn_ = false;
  }
  // A message on its own line (the bar is redrawn after it).
  void note(const std::string& message) {
    if (!enabled_) return;
    std::string line = (tty_ && drawn_ ? "\r\033[K" : "") + std::string("tilejit tune: ") + message + "\n";
    std::fputs(line.c_str(), stderr);
  }

 private:
  bool enabled_;
  std::string title_;
  bool tty_;
  bool drawn_ = false;
  clock_type::time_point last_{};
};

class Tuner {
 public:
  Tuner(const Kernel& k, const std::vector<ArgSpec>& specs, const TuneOptions& o)
      : k_(k), specs_(specs), o_(o), start_(clock_type::now()), progress_(o.progress, "tune " + k.name()) {}

  ~Tuner() { stop_pool(); }

  TuneResult run();

 private:
  // --- setup
  void check_specs();
  void start_worker_and_identify();
  bool ensure_worker();
  std::string setup_request() const;
  // --- candidates
  int get_or_create(const Config& c, bool in_space);
  Cand& cand(int id) {
    std::lock_guard lock(mutex_);
    return *cands_.at(static_cast<size_t>(id));
  }
  void prepare(int id);          // pool thread: generate, prune, dedupe, compile
  void start_pool();
  void stop_pool();
  void evaluate(const std::vector<int>& ids);
  void bench(Cand& c, bool as_reference);
  void finish(Cand& c);
  double cost_of(int id);
  bool establish_reference();
  double candidate_timeout() const;
  bool past_deadline() const { return deadline_s_ > 0 && seconds_since(start_) > deadline_s_; }
  void draw(bool force = false);

  const Kernel& k_;
  std::vector<ArgSpec> specs_;        // concrete
  std::vector<ArgSpec> trace_specs_;  // what compile() gets (dynamic dims with dynamic_shapes)
  TuneOptions o_;
  clock_type::time_point start_;
  ProgressLine progress_;
  ir::Function f_;
  std::string arch_;
  DeviceReport dev_;
  std::unique_ptr<Bench> bench_;
  bool worker_ready_ = false;
  int start_failures_ = 0;
  std::string setup_json_;
  std::vector<double> tolerance_;
  std::vector<ArgValue> shape_args_;  // parameters with shapes only, for launch_shape
  ConfigSpace space_;
  double deadline_s_ = 0;
  int planned_ = 0;
  std::vector<std::string> notes_;

  std::mutex mutex_;
  std::condition_variable pool_cv_, ready_cv_;
  std::vector<std::unique_ptr<Cand>> cands_;
  std::map<std::string, int> by_config_;
  std::map<std::string, int> by_code_;
  std::deque<int> todo_, ready_;
  std::vector<std::thread> pool_;
  bool quit_ = false;

  std::map<int, std::vector<int>> waiting_;   // original id -> duplicates waiting for its result
  int done_ = 0;
  int best_id_ = -1;
  double best_ms_ = kFailed;
  int reference_id_ = -1;
  double reference_wall_s_ = 0;
};

void Tuner::check_specs() {
  for (const auto& s : specs_)
    if (const auto* t = std::get_if<TensorSpec>(&s)) {
      for (int64_t d : t->shape)
        if (d < 0) throw Error(fmt::format("tune '{}': tensor shapes must be concrete (got a dynamic dimension)", k_.name()));
      // The workers time every candidate on contiguous tensors of these shapes.
      const TensorView contiguous{nullptr, t->dtype, t->shape, {}, Device::cuda};
      const std::vector<int64_t> row_major = contiguous.contiguous_strides();
      for (size_t d = 0; d < t->strides.size() && d < row_major.size(); ++d)
        if (t->strides[d] >= 0 && t->strides[d] != row_major[d])
          throw Error(fmt::format("tune '{}': a tensor spec [{}] compiles in stride {} for dim {}, but the tuner runs on "
                                  "contiguous tensors (stride {} there)",
                                  k_.name(), fmt::join(t->shape, ", "), t->strides[d], d, row_major[d]));
    }
  trace_specs_ = specs_;
  if (o_.dynamic_shapes)
    for (auto& s : trace_specs_)
      if (auto* t = std::get_if<TensorSpec>(&s)) std::fill(t->shape.begin(), t->shape.end(), -1);
  f_ = k_.trace(trace_specs_);

  // Kernels that read fp8 inputs quantize inside too (e.g. attention's P before the second
  // dot): another tiling moves their outputs by up to an fp8 rounding step, whatever the
  // output type.
  bool fp8_inputs = false;
  for (const ir::Param& p : f_.params) fp8_inputs |= p.is_tensor() && !p.writes() && is_fp8(p.dtype);
  json params = json::array();
  size_t slot = 0;
  for (const ir::Param& p : f_.params) {
    while (slot < k_.slots().size() && k_.slots()[slot].is_host()) ++slot;
    const ArgSpec& spec = specs_.at(slot++);
    if (p.is_tensor()) {
      const auto& t = std::get<TensorSpec>(spec);
      const char* role = p.kind == ir::ParamKind::tensor_in ? "in" : p.kind == ir::ParamKind::tensor_out ? "out" : "inout";
      params.push_back(json{{"tensor", true}, {"dtype", std::string(name(t.dtype))}, {"shape", t.shape}, {"role", role}});
      if (p.writes())
        tolerance_.push_back(fp8_inputs ? std::max(output_tolerance(t.dtype), output_tolerance(DType::e4m3))
                                        : output_tolerance(t.dtype));
      shape_args_.emplace_back(TensorView{nullptr, t.dtype, t.shape, {}, Device::cuda});
    } else {
      double v = 0;
      if (const auto* r = std::get_if<RuntimeScalar>(&spec)) v = r->value;
      params.push_back(json{{"tensor", false}, {"value", v}, {"dtype", p.kind == ir::ParamKind::scalar_i64 ? "i64" : "f32"}});
      shape_args_.emplace_back(static_cast<float>(v));
    }
  }
  setup_json_ = json{{"op", "setup"}, {"params", params}, {"seed", o_.seed}}.dump();
}

void Tuner::start_worker_and_identify() {
  if (o_.isolate) {
    std::string exe = o_.worker_executable.empty() ? find_worker_executable() : o_.worker_executable;
    if (exe.empty()) {
      notes_.push_back(
          "no tilejit executable found for the tuning worker ($TILEJIT_TUNE_WORKER names one); benchmarking in this process "
          "without fault isolation");
      bench_ = std::make_unique<InProcessBench>();
    } else {
      bench_ = std::make_unique<ProcessBench>(exe);
    }
  } else {
    bench_ = std::make_unique<InProcessBench>();
  }
  bench_->start();
  WorkerReply r = bench_->call(R"({"op":"hello"})", 120);
  if (!r.ok) throw Error("the tuning worker did not start: " + r.failure);
  json j = json::parse(r.line);
  if (!j.value("ok", false))
    throw Error("the tuning worker cannot use the GPU: " + j.value("error", j.value("detail", std::string("unknown error"))));
  const json& d = j.at("device");
  dev_.id.name = d.at("name").get<std::string>();
  dev_.id.cc_major = d.at("cc_major").get<int>();
  dev_.id.cc_minor = d.at("cc_minor").get<int>();
  dev_.id.arch = d.at("arch").get<std::string>();
  dev_.id.driver_version = d.at("driver").get<int>();
  dev_.id.nvrtc_version = runtime::nvrtc_version();
  dev_.sm_count = d.value("sm_count", 0);
  dev_.l2_bytes = d.value("l2_bytes", 0LL);
  dev_.smem_optin = d.value("smem_optin", 0LL);
  dev_.regs_per_block = d.value("regs_per_block", 0LL);
  dev_.threads_per_block = d.value("threads_per_block", 1024LL);
  arch_ = dev_.id.arch;
}

bool Tuner::ensure_worker() {
  if (worker_ready_ && bench_->running()) return true;
  worker_ready_ = false;
  while (start_failures_ < 3) {
    try {
      if (!bench_->running()) {
        bench_->start();
        WorkerReply h = bench_->call(R"({"op":"hello"})", 120);
        if (!h.ok || !json::parse(h.line).value("ok", false)) throw Error("hello failed: " + (h.ok ? h.line : h.failure));
      }
      WorkerReply s = bench_->call(setup_json_, 600);
      if (!s.ok) throw Error("setup failed: " + s.failure);
      json j = json::parse(s.line);
      if (!j.value("ok", false)) throw Error("setup failed: " + j.value("error", j.value("detail", s.line)));
      worker_ready_ = true;
      if (reference_id_ >= 0) {
        // A fresh worker needs the reference output again.
        Cand& ref = cand(reference_id_);
        Candidate saved = ref.pub;
        bench(ref, /*as_reference=*/true);
        bool ok = ref.pub.status == Status::ok;
        ref.pub = saved;
        if (!ok) throw Error("the reference config failed in a fresh worker");
      }
      return true;
    } catch (const std::exception& e) {
      ++start_failures_;
      notes_.push_back(fmt::format("tuning worker: {}", e.what()));
      bench_->stop();
      worker_ready_ = false;
    }
  }
  return false;
}

int Tuner::get_or_create(const Config& c, bool in_space) {
  std::string key = c.to_json();
  std::lock_guard lock(mutex_);
  auto it = by_config_.find(key);
  if (it != by_config_.end()) return it->second;
  int id = static_cast<int>(cands_.size());
  auto cd = std::make_unique<Cand>();
  cd->pub.id = id;
  cd->pub.config = c;
  cd->pub.in_space = in_space;
  cands_.push_back(std::move(cd));
  by_config_[key] = id;
  return id;
}

void Tuner::prepare(int id) {
  Cand* c;
  {
    std::lock_guard lock(mutex_);
    c = cands_.at(static_cast<size_t>(id)).get();
  }
  const Config cfg = c->pub.config;
  auto done = [&](Status s, std::string detail) {
    c->pub.status = s;
    c->pub.detail = std::move(detail);
  };
  try {
    const long long threads = static_cast<long long>(cfg.num_warps) * 32;
    if (threads > dev_.threads_per_block) {
      done(Status::pruned, fmt::format("{} threads per block; {} allows {}", threads, dev_.id.name, dev_.threads_per_block));
    } else {
      codegen::GeneratedKernel g = codegen::generate_cuda(f_, cfg, codegen::Target::parse(arch_));
      if (dev_.smem_optin > 0 && static_cast<long long>(g.dynamic_smem_bytes) > dev_.smem_optin) {
        done(Status::pruned,
             fmt::format("{} bytes of shared memory; {} allows {} per block", g.dynamic_smem_bytes, dev_.id.name, dev_.smem_optin));
      } else {
        std::string code = code_identity(g.source, cfg);
        int original = -1;
        {
          std::lock_guard lock(mutex_);
          auto [it, inserted] = by_code_.emplace(code, id);
          if (!inserted) original = it->second;
        }
        if (original >= 0) {
          c->pub.status = Status::duplicate;
          c->pub.duplicate_of = original;
          c->pub.detail = fmt::format("generates the same code as candidate #{}", original);
        } else {
          const CompiledKernel& ck = compile(k_, trace_specs_, cfg, CompileRequest{.arch = arch_, .want_ptx = false, .load = false});
          if (!ck.from_disk_cache) c->pub.compile_ms = ck.compile_ms;
          int64_t programs = launch_shape(ck.ir, cfg, shape_args_).programs;
          c->geometry = launch_geometry(ck, std::max<int64_t>(programs, 1), dev_.sm_count);
          c->tma = ck.generated.tma;
          c->entry = ck.generated.entry;
          std::string key = compile_key(ck.generated.source, arch_);
          runtime::DiskCache disk(runtime::DiskCache::default_dir());
          std::error_code ec;
          if (std::filesystem::exists(disk.path_for(key), ec)) c->cubin_key = key;
          else c->cubin = ck.cubin;
        }
      }
    }
  } catch (const CompileError& e) {
    done(Status::compile_error, e.what());
  } catch (const std::exception& e) {
    done(Status::invalid, e.what());
  }
  std::lock_guard lock(mutex_);
  c->phase = Cand::Phase::ready;
  ready_.push_back(id);
  ready_cv_.notify_all();
}

void Tuner::start_pool() {
  int n = o_.compile_threads > 0 ? o_.compile_threads : static_cast<int>(std::thread::hardware_concurrency()) - 1;
  n = std::clamp(n, 1, 64);
  for (int i = 0; i < n; ++i) {
    pool_.emplace_back([this] {
      while (true) {
        int id;
        {
          std::unique_lock lock(mutex_);
          pool_cv_.wait(lock, [&] { return quit_ || !todo_.empty(); });
          if (quit_) return;
          id = todo_.front();
          todo_.pop_front();
        }
        prepare(id);
      }
    });
  }
}

void Tuner::stop_pool() {
  {
    std::lock_guard lock(mutex_);
    quit_ = true;
    todo_.clear();
  }
  pool_cv_.notify_all();
  for (auto& t : pool_) t.join();
  pool_.clear();
}

double Tuner::candidate_timeout() const {
  double t = std::max(5.0, 1.0 + 40.0 * reference_wall_s_);
  if (reference_id_ < 0) t = std::max(t, 60.0);   // the reference itself: no measure yet
  return std::min(o_.candidate_timeout_s, t);
}

void Tuner::bench(Cand& c, bool as_reference) {
  if (!ensure_worker()) {
    c.pub.status = Status::skipped;
    c.pub.detail = "no working GPU worker";
    return;
  }
  int repeats = o_.repeats > 0 ? o_.repeats : o_.effort == Effort::quick ? 5 : 10;
  json req;
  req["op"] = "bench";
  req["id"] = c.pub.id;
  req["config"] = c.pub.config.to_json();
  if (!c.cubin_key.empty()) req["cubin_key"] = c.cubin_key;
  else req["cubin_b64"] = base64(c.cubin);
  req["entry"] = c.entry;
  req["grid"] = {c.geometry.grid.x, c.geometry.grid.y, c.geometry.grid.z};
  req["block"] = {c.geometry.block.x, c.geometry.block.y, c.geometry.block.z};
  req["cluster"] = {c.geometry.cluster.x, c.geometry.cluster.y, c.geometry.cluster.z};
  req["smem"] = c.geometry.dynamic_smem;
  req["persistent"] = c.geometry.persistent;
  req["programs"] = c.geometry.programs;
  if (!c.tma.empty()) {
    json tma = json::array();
    for (const auto& op : c.tma)
      tma.push_back(json{{"param", op.param},
                         {"box", op.box},
                         {"swizzle", op.swizzle_bytes},
                         {"element_strides", op.element_strides}});
    req["tma"] = tma;
  }
  req["reference"] = as_reference;
  req["check"] = !as_reference;
  req["tolerance"] = tolerance_;
  req["best_ms"] = !as_reference && std::isfinite(best_ms_) ? best_ms_ : 0.0;   // the reference is never stopped early
  req["repeats"] = repeats;
  req["max_bench_ms"] = 1000.0;
  req["early_stop"] = o_.early_stop;
  req["fault"] = c.pub.config.knob(knob_names::fault, 0);
  const auto t0 = clock_type::now();
  WorkerReply r = bench_->call(req.dump(), candidate_timeout());
  const double wall = seconds_since(t0);
  if (!r.ok) {
    c.pub.status = r.timed_out ? Status::timeout : Status::fault;
    c.pub.detail = r.failure;
    worker_ready_ = false;
    bench_->stop();
    return;
  }
  json j;
  try {
    j = json::parse(r.line);
  } catch (const std::exception& e) {
    c.pub.status = Status::error;
    c.pub.detail = std::string("unreadable worker reply: ") + e.what();
    return;
  }
  const std::string status = j.value("status", std::string("error"));
  c.pub.detail = j.value("detail", j.value("error", std::string()));
  c.pub.registers = j.value("regs", 0);
  c.pub.spill_bytes = j.value("spill_bytes", 0);
  if (j.contains("ms") && j["ms"].is_number()) c.pub.ms = j["ms"].get<double>();
  if (status == "ok") c.pub.status = Status::ok;
  else if (status == "hopeless") c.pub.status = Status::hopeless;
  else if (status == "pruned") c.pub.status = Status::pruned;
  else if (status == "wrong") c.pub.status = Status::wrong;
  else if (status == "fault") c.pub.status = Status::fault;
  else c.pub.status = Status::error;
  if (c.pub.status != Status::ok && c.pub.status != Status::hopeless) c.pub.ms = kFailed;
  if (c.pub.status == Status::fault) {
    worker_ready_ = false;
    bench_->stop();
  }
  if (as_reference && c.pub.status == Status::ok) reference_wall_s_ = wall;
}

void Tuner::finish(Cand& c) {
  {
    std::lock_guard lock(mutex_);
    c.phase = Cand::Phase::done;
  }
  ++done_;
  if (c.pub.status == Status::ok && c.pub.ms < best_ms_) {
    best_ms_ = c.pub.ms;
    best_id_ = c.pub.id;
  }
  if (c.pub.status == Status::fault || c.pub.status == Status::timeout || c.pub.status == Status::wrong ||
      c.pub.status == Status::compile_error)
  {
    std::string detail = c.pub.detail.size() > 400 ? c.pub.detail.substr(0, 400) + "..." : c.pub.detail;
    std::replace(detail.begin(), detail.end(), '\n', ' ');
    progress_.note(fmt::format("candidate #{} {}: {}: {}", c.pub.id, c.pub.config.to_json(), name(c.pub.status), detail));
  }
  if (o_.on_candidate) o_.on_candidate(c.pub);
  // Duplicates waiting for this one share its result.
  auto it = waiting_.find(c.pub.id);
  if (it != waiting_.end()) {
    std::vector<int> dups = std::move(it->second);
    waiting_.erase(it);
    for (int d : dups) {
      Cand& dc = cand(d);
      dc.pub.ms = c.pub.ms;
      finish(dc);
    }
  }
  draw();
}

double Tuner::cost_of(int id) {
  Cand& c = cand(id);
  if (c.pub.status == Status::duplicate && c.pub.duplicate_of >= 0) return cost_of(c.pub.duplicate_of);
  if (c.pub.status == Status::ok || c.pub.status == Status::hopeless) return c.pub.ms;
  return kFailed;
}

void Tuner::evaluate(const std::vector<int>& ids) {
  std::set<int> pending;
  {
    std::lock_guard lock(mutex_);
    for (int id : ids) {
      Cand& c = *cands_.at(static_cast<size_t>(id));
      if (c.phase == Cand::Phase::done) continue;
      pending.insert(id);
      if (!c.submitted) {
        c.submitted = true;
        todo_.push_back(id);
      }
    }
  }
  pool_cv_.notify_all();
  while (!pending.empty()) {
    int id = -1;
    {
      std::unique_lock lock(mutex_);
      ready_cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return !ready_.empty(); });
      if (!ready_.empty()) {
        id = ready_.front();
        ready_.pop_front();
      }
    }
    if (past_deadline()) {
      // Out of time: what the pool has not started is skipped now (not compiled first).
      std::vector<int> skipped;
      {
        std::lock_guard lock(mutex_);
        for (auto it = todo_.begin(); it != todo_.end();) {
          if (pending.count(*it)) {
            Cand& q = *cands_.at(static_cast<size_t>(*it));
            q.pub.status = Status::skipped;
            q.pub.detail = "the time budget ran out";
            skipped.push_back(*it);
            it = todo_.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (int q : skipped) {
        finish(cand(q));
        pending.erase(q);
      }
    }
    if (id < 0) {
      draw();
      continue;
    }
    Cand& c = cand(id);
    const bool compiled = !c.entry.empty();
    if (c.pub.status == Status::duplicate) {
      Cand& orig = cand(c.pub.duplicate_of);
      bool orig_done;
      {
        std::lock_guard lock(mutex_);
        orig_done = orig.phase == Cand::Phase::done;
      }
      if (orig_done) {
        c.pub.ms = orig.pub.ms;
        finish(c);
      } else {
        waiting_[orig.pub.id].push_back(id);
      }
    } else if (!compiled) {
      finish(c);   // invalid, pruned, compile error: decided without the GPU
    } else if (past_deadline() && best_id_ >= 0) {   // until one candidate ran, the budget does not skip
      c.pub.status = Status::skipped;
      c.pub.detail = "the time budget ran out";
      finish(c);
    } else {
      bench(c, c.pub.reference);
      finish(c);
    }
    // Everything that finished (including duplicates resolved by finish) leaves `pending`.
    std::lock_guard lock(mutex_);
    for (auto it = pending.begin(); it != pending.end();) {
      if (cands_.at(static_cast<size_t>(*it))->phase == Cand::Phase::done) it = pending.erase(it);
      else ++it;
    }
  }
}

bool Tuner::establish_reference() {
  std::vector<Config> tries = {untuned_config(f_, arch_)};
  // Fallbacks when the default config does not work here: points near it.
  Point p0 = space_.point_of(tries[0]);
  tries.push_back(space_.config_at(p0));
  const std::vector<int> sizes = space_.sizes();
  for (size_t d = 0; d < sizes.size() && tries.size() < 8; ++d) {
    for (int step : {-1, +1}) {
      Point q = p0;
      q[d] += step;
      if (q[d] >= 0 && q[d] < sizes[d] && tries.size() < 8) tries.push_back(space_.config_at(q));
    }
  }
  for (const Config& cfg : tries) {
    int id = get_or_create(cfg, space_.contains(cfg));
    Cand& c = cand(id);
    if (c.phase == Cand::Phase::done) continue;
    c.pub.reference = true;
    evaluate({id});
    if (c.pub.status == Status::ok) {
      reference_id_ = id;
      return true;
    }
    c.pub.reference = false;
    notes_.push_back(fmt::format("config {} cannot be the reference: {}: {}", cfg.to_json(), name(c.pub.status), c.pub.detail));
  }
  return false;
}

void Tuner::draw(bool force) {
  std::string cfg = best_id_ >= 0 ? cand(best_id_).pub.config.to_json() : "";
  double ref_ms = reference_id_ >= 0 ? cand(reference_id_).pub.ms : kFailed;
  int total = std::max(planned_, done_);
  double elapsed = seconds_since(start_);
  double eta = done_ > 0 ? elapsed / done_ * (total - done_) : kFailed;
  if (deadline_s_ > 0 && std::isfinite(eta)) eta = std::min(eta, std::max(0.0, deadline_s_ - elapsed));
  progress_.update(done_, total, best_ms_, ref_ms, o_.flops, cfg, eta, force);
}

TuneResult Tuner::run() {
  TuneResult result;
  check_specs();
  if (o_.effort == Effort::none) {
    // No worker: the arch of this process's GPU when the driver has one (what a config-less
    // launch here gets), else none and the generic default.
    if (arch_.empty() && runtime::driver().available()) {
      try {
        arch_ = runtime::current_device().arch();
      } catch (const Error&) {
      }
    }
    result.reference_config = untuned_config(f_, arch_);
    result.best = result.reference_config;
    result.strategy = Strategy::exhaustive;
    result.seconds = seconds_since(start_);
    result.notes.push_back("effort none: the default config, nothing measured");
    return result;
  }

  start_worker_and_identify();
  result.reference_config = untuned_config(f_, arch_);   // now that the GPU's arch is known
  result.device = dev_.id;
  result.isolated = bench_->isolated();
  result.key = tuning_key(k_, specs_, o_.dynamic_shapes, dev_.id);
  TuningCache cache(o_.cache_file.empty() ? TuningCache::default_path() : std::filesystem::path(o_.cache_file));
  if (o_.use_cache) {
    if (auto e = cache.lookup(result.key)) {
      result.best = e->config;
      result.best_ms = e->ms;
      result.reference_ms = e->default_ms;
      result.from_cache = true;
      result.seconds = seconds_since(start_);
      bench_->stop();
      return result;
    }
  }

  SpaceOptions so = o_.space;
  so.arch = arch_;
  space_ = derive_space(f_, so);
  result.space = space_.describe();
  result.space_size = space_.size();

  // Effort -> strategy and budget.
  SearchOptions search;
  double budget = o_.time_budget_s;
  switch (o_.effort) {
    case Effort::quick:
      search.exhaustive_limit = 48;
      search.random_samples = 8;
      search.starts = 1;
      search.max_evaluations = 60;
      if (budget <= 0) budget = 20;
      break;
    case Effort::full:
      search.exhaustive_limit = 128;
      search.random_samples = 16;
      search.starts = 3;
      search.max_evaluations = 250;
      if (budget <= 0) budget = 50;
      break;
    case Effort::exhaustive:
      search.strategy = Strategy::exhaustive;
      break;
    case Effort::none: break;
  }
  if (o_.strategy) search.strategy = *o_.strategy;
  search.seed = o_.seed;
  deadline_s_ = budget;
  const std::vector<int> sizes = space_.sizes();
  Strategy planned_strategy = search.strategy;
  if (planned_strategy == Strategy::automatic)
    planned_strategy = space_.size() <= search.exhaustive_limit ? Strategy::exhaustive : Strategy::pattern;
  // For the progress line: the points the search will visit, the extra candidates, and the
  // reference when it is not a point of the space.
  planned_ = static_cast<int>(planned_strategy == Strategy::exhaustive
                                  ? std::min<uint64_t>(space_.size(), 1u << 20)
                                  : std::min<uint64_t>(space_.size(), static_cast<uint64_t>(search.max_evaluations))) +
             static_cast<int>(o_.extra_candidates.size()) + (space_.contains(untuned_config(f_, arch_)) ? 0 : 1);

  start_pool();
  const int compiles_before = static_cast<int>(nvrtc_compile_count());
  progress_.note(fmt::format("{} on {} ({}), {}: {}", k_.name(), dev_.id.name, arch_, result.isolated ? "worker process" : "in process",
                             result.space));
  if (!establish_reference()) {
    progress_.finish();
    std::string why;
    for (const auto& n : notes_) why += "\n  " + n;
    throw Error(fmt::format("tune '{}': no reference config works on this GPU:{}", k_.name(), why));
  }
  const Config ref_cfg = cand(reference_id_).pub.config;
  result.reference_config = ref_cfg;

  // Hand-given candidates first.
  if (!o_.extra_candidates.empty()) {
    std::vector<int> ids;
    for (const Config& c : o_.extra_candidates) ids.push_back(get_or_create(c, space_.contains(c)));
    evaluate(ids);
  }

  // Seeds: the default config's point and two heuristics (large tiles with 8 warps, small
  // tiles with 4 warps).
  search.seeds.push_back(space_.point_of(ref_cfg));
  for (auto [blk, warps] : {std::pair<int64_t, int>{128, 8}, std::pair<int64_t, int>{32, 4}}) {
    Config c = ref_cfg;
    for (auto& [n, v] : c.blocks) v = blk;
    c.num_warps = warps;
    search.seeds.push_back(space_.point_of(c));
  }
  search.stop = [this] { return past_deadline(); };
  BatchCost cost = [this](const std::vector<Point>& pts) {
    std::vector<int> ids;
    for (const Point& p : pts) ids.push_back(get_or_create(space_.config_at(p), true));
    evaluate(ids);
    std::vector<double> out;
    for (int id : ids) out.push_back(cost_of(id));
    return out;
  };
  SearchResult sr = space_.dims().empty() ? SearchResult{} : autotune::search(sizes, cost, search);
  result.strategy = space_.dims().empty() ? Strategy::exhaustive : sr.strategy;
  stop_pool();
  draw(true);
  progress_.finish();
  bench_->stop();

  // Results.
  {
    std::lock_guard lock(mutex_);
    for (const auto& c : cands_) {
      result.candidates.push_back(c->pub);
      result.compile_seconds += c->pub.compile_ms / 1000.0;
    }
  }
  result.nvrtc_compiles = static_cast<int>(nvrtc_compile_count()) - compiles_before;
  result.worker_starts = bench_->starts();
  result.reference_ms = cand(reference_id_).pub.ms;
  if (sr.stopped || past_deadline()) result.notes.push_back(fmt::format("the time budget ({:.0f} s) ended the search", deadline_s_));
  for (auto& n : notes_) result.notes.push_back(n);
  if (best_id_ < 0) throw Error(fmt::format("tune '{}': no candidate ran correctly", k_.name()));
  result.best = cand(best_id_).pub.config;
  result.best_ms = best_ms_;

  if (o_.store) {
    TuningEntry e;
    e.key = result.key;
    e.config = result.best;
    e.ms = result.best_ms;
    e.default_ms = result.reference_ms;
    std::vector<std::string> shapes;
    for (const auto& s : specs_)
      if (const auto* t = std::get_if<TensorSpec>(&s)) shapes.push_back(fmt::format("{}", fmt::join(t->shape, "x")));
    e.shape = fmt::format("{}", fmt::join(shapes, ","));
    e.effort = std::string(name(o_.effort));
    int measured = 0;
    for (const auto& c : result.candidates) measured += c.status == Status::ok || c.status == Status::hopeless;
    e.candidates = measured;
    result.stored = cache.store(e);   // false: the warning says why (a read-only cache, ...)
    clear_launch_plans();
  }
  result.seconds = seconds_since(start_);
  return result;
}

}  // namespace

TuneResult tune(const Kernel& k, const std::vector<ArgSpec>& specs, const TuneOptions& options) {
  Tuner t(k, specs, options);
  return t.run();
}

}  // namespace tj::autotune

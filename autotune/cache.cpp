#include "autotune/cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/atomic_file.h"
#include "runtime/device.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "core/error.h"
#include "runtime/hash.h"
#include "runtime/nvrtc.h"

namespace tj::autotune {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::atomic<uint64_t> g_generation{1};

void warn(const std::string& message) {
  std::string line = "tilejit: " + message + "\n";
  std::fputs(line.c_str(), stderr);
}

std::string join_dims(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + (shape[i] < 0 ? std::string("?") : std::to_string(shape[i]));
  return s;
}

std::vector<ArgSpec> bucketed(const std::vector<ArgSpec>& specs) {
  std::vector<ArgSpec> out = specs;
  for (auto& s : out)
    if (auto* t = std::get_if<TensorSpec>(&s))
      for (auto& d : t->shape) d = bucket_dim(d);
  return out;
}

std::vector<ArgSpec> dynamic(const std::vector<ArgSpec>& specs) {
  std::vector<ArgSpec> out = specs;
  for (auto& s : out)
    if (auto* t = std::get_if<TensorSpec>(&s))
      for (auto& d : t->shape) d = -1;
  return out;
}

std::string shapes_str(const std::vector<ArgSpec>& specs) {
  std::vector<std::string> parts;
  for (const auto& s : specs)
    if (const auto* t = std::get_if<TensorSpec>(&s)) parts.push_back(join_dims(t->shape));
  return fmt::format("{}", fmt::join(parts, ","));
}

// --- file memo -------------------------------------------------------------------------

struct Signature {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const Signature&) const = default;
};

Signature signature_of(const fs::path& p) {
  struct stat st {};
  Signature s;
  if (::stat(p.c_str(), &st) != 0) return s;
  s.exists = true;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = st.st_size;
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return s;
}

std::string read_file(const fs::path& p, bool& ok) {
  ok = false;
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return {};
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  ok = true;
  return out;
}

json entry_to_json(const TuningEntry& e) {
  json j;
  j["kernel"] = e.key.kernel;
  j["fingerprint"] = e.key.fingerprint;
  j["device"] = e.key.device;
  j["bucket"] = e.key.bucket;
  j["dtypes"] = e.key.dtypes;
  j["toolkit"] = e.key.toolkit;
  j["config"] = json::parse(e.config.to_json());
  j["ms"] = e.ms;
  j["default_ms"] = e.default_ms;
  j["shape"] = e.shape;
  j["effort"] = e.effort;
  j["candidates"] = e.candidates;
  j["created"] = e.created;
  return j;
}

// Throws std::exception (json or tj::Error) when `j` is not a well-formed entry.
TuningEntry entry_from_json(const std::string& name, const json& j) {
  if (!j.is_object()) throw Error("not an object");
  TuningEntry e;
  e.key.kernel = j.at("kernel").get<std::string>();
  e.key.fingerprint = j.at("fingerprint").get<std::string>();
  e.key.device = j.at("device").get<std::string>();
  e.key.bucket = j.at("bucket").get<std::string>();
  e.key.dtypes = j.at("dtypes").get<std::string>();
  e.key.toolkit = j.at("toolkit").get<std::string>();
  e.config = Config::from_json(j.at("config").dump());
  e.ms = j.value("ms", 0.0);
  e.default_ms = j.value("default_ms", 0.0);
  e.shape = j.value("shape", std::string());
  e.effort = j.value("effort", std::string());
  e.candidates = j.value("candidates", 0);
  e.created = j.value("created", int64_t(0));
  if (e.key.str() != name) throw Error("its name does not match its fields");
  return e;
}

struct Parsed {
  std::map<std::string, TuningEntry> entries;
  bool corrupt = false;        // the whole file was rejected
};

// Parses a cache file's text; `warn_about` set: print the reasons on stderr.
Parsed parse(const std::string& text, const fs::path& path, bool report) {
  Parsed p;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    if (report) warn(fmt::format("ignoring corrupt tuning cache {}: not valid JSON ({})", path.string(), e.what()));
    p.corrupt = true;
    return p;
  }
  if (!j.is_object() || j.value("format", std::string()) != "tilejit-tuning" || !j.contains("entries") ||
      !j["entries"].is_object()) {
    if (report) warn(fmt::format("ignoring corrupt tuning cache {}: not a tilejit tuning cache", path.string()));
    p.corrupt = true;
    return p;
  }
  int version = j.value("version", -1);
  if (version != TuningCache::kFormatVersion) {
    if (report)
      warn(fmt::format("ignoring stale tuning cache {}: format version {}, expected {}", path.string(), version,
                       TuningCache::kFormatVersion));
    p.corrupt = true;
    return p;
  }
  for (auto& [name, value] : j["entries"].items()) {
    try {
      p.entries.emplace(name, entry_from_json(name, value));
    } catch (const std::exception& e) {
      if (report) warn(fmt::format("ignoring stale tuning cache entry '{}' in {}: {}", name, path.string(), e.what()));
    }
  }
  return p;
}

struct Memo {
  std::mutex mutex;
  std::map<std::string, std::pair<Signature, std::shared_ptr<const Parsed>>> files;
};
Memo& memo() {
  static Memo m;
  return m;
}

std::shared_ptr<const Parsed> load(const fs::path& path) {
  Signature sig = signature_of(path);
  Memo& m = memo();
  {
    std::lock_guard lock(m.mutex);
    auto it = m.files.find(path.string());
    if (it != m.files.end() && it->second.first == sig) return it->second.second;
  }
  auto parsed = std::make_shared<Parsed>();
  if (sig.exists) {
    bool ok = false;
    std::string text = read_file(path, ok);
    if (ok) *parsed = parse(text, path, /*report=*/true);
    else warn(fmt::format("cannot read tuning cache {}: {}", path.string(), std::strerror(errno)));
  }
  std::lock_guard lock(m.mutex);
  m.files[path.string()] = {sig, parsed};
  return parsed;
}

// Holds an exclusive flock on <file>.lock for the scope.
class FileLock {
 public:
  explicit FileLock(const fs::path& file) {
    fs::path lock = file;
    lock += ".lock";
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
    }
  }
  ~FileLock() {
    if (fd_ >= 0) {
      ::flock(fd_, LOCK_UN);
      ::close(fd_);
    }
  }
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Under the lock: read, apply `edit` to the entries, write atomically.
template <class Edit>
bool rewrite(const fs::path& path, Edit&& edit) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  if (ec) {
    warn(fmt::format("cannot write tuning cache {}: cannot create {}: {}", path.string(), path.parent_path().string(),
                     ec.message()));
    return false;
  }
  FileLock lock(path);
  if (!lock.held()) {
    warn(fmt::format("cannot write tuning cache {}: cannot lock {}.lock: {}", path.string(), path.string(),
                     std::strerror(errno)));
    return false;
  }
  Parsed current;
  if (signature_of(path).exists) {
    bool ok = false;
    std::string text = read_file(path, ok);
    if (ok) current = parse(text, path, /*report=*/false);
  }
  bool changed = edit(current.entries);
  if (!changed && !current.corrupt) return false;

  json entries = json::object();
  for (const auto& [name, e] : current.entries) entries[name] = entry_to_json(e);
  json doc;
  doc["format"] = "tilejit-tuning";
  doc["version"] = TuningCache::kFormatVersion;
  doc["entries"] = std::move(entries);
  std::string text = doc.dump(1) + "\n";

  const std::string why = runtime::replace_file(path, {text});
  if (!why.empty()) {
    warn(fmt::format("cannot write tuning cache {}: {}", path.string(), why));
    return false;
  }
  return true;
}

}  // namespace

// --- identity and keys ---------------------------------------------------------------------

std::string DeviceIdentity::device_str() const { return fmt::format("{} (cc {}.{})", name, cc_major, cc_minor); }

std::string DeviceIdentity::toolkit_str() const { return fmt::format("nvrtc {}, driver {}", nvrtc_version, driver_version); }

const DeviceIdentity& current_identity() {
  static const DeviceIdentity id = [] {
    const auto& d = runtime::current_device();
    DeviceIdentity i;
    i.name = d.name;
    i.cc_major = d.cc_major;
    i.cc_minor = d.cc_minor;
    i.arch = d.arch();
    i.driver_version = d.driver_version;
    i.nvrtc_version = runtime::nvrtc_version();
    return i;
  }();
  return id;
}

int64_t bucket_dim(int64_t d) {
  if (d <= 256) return d;
  int64_t p = 512;
  while (p < d && p < (int64_t(1) << 62)) p <<= 1;
  return p;
}

std::string TuningKey::str() const {
  return fmt::format("{}|{}|{}|{}|{}|{}", kernel, fingerprint, device, bucket, dtypes, toolkit);
}

TuningKey tuning_key(const Kernel& k, const std::vector<ArgSpec>& specs, bool dynamic_shapes, const DeviceIdentity& device) {
  TuningKey key;
  key.kernel = k.name();
  key.device = device.device_str();
  key.toolkit = device.toolkit_str();
  std::vector<std::string> dtypes;
  for (const auto& s : specs)
    if (const auto* t = std::get_if<TensorSpec>(&s)) dtypes.emplace_back(name(t->dtype));
  key.dtypes = fmt::format("{}", fmt::join(dtypes, ","));

  std::vector<ArgSpec> b = bucketed(specs);
  std::string ir_text;
  if (dynamic_shapes) {
    ir_text = ir::print(k.trace(dynamic(specs)));
    key.bucket = "dyn:" + shapes_str(b);
  } else {
    try {
      ir_text = ir::print(k.trace(b));
      key.bucket = shapes_str(b);
    } catch (const std::exception&) {
      ir_text = ir::print(k.trace(specs));   // the kernel needs its exact shape
      key.bucket = shapes_str(specs);
    }
  }
  runtime::Hasher h;
  h.field("tilejit-tuning-fingerprint-v1").field(ir_text);
  key.fingerprint = h.hex();
  return key;
}

// --- the cache -------------------------------------------------------------------------------

TuningCache::TuningCache(fs::path file) : path_(std::move(file)) {}

fs::path TuningCache::default_path() { return runtime::DiskCache::default_dir() / "tuning.json"; }

std::optional<TuningEntry> TuningCache::lookup(const TuningKey& key) const {
  auto parsed = load(path_);
  auto it = parsed->entries.find(key.str());
  if (it == parsed->entries.end()) return std::nullopt;
  return it->second;
}

std::vector<TuningEntry> TuningCache::entries() const {
  auto parsed = load(path_);
  std::vector<TuningEntry> out;
  for (const auto& [name, e] : parsed->entries) out.push_back(e);
  return out;
}

bool TuningCache::store(const TuningEntry& entry) const {
  TuningEntry e = entry;
  if (e.created == 0)
    e.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const bool written = rewrite(path_, [&](std::map<std::string, TuningEntry>& entries) {
    entries[e.key.str()] = e;
    return true;
  });
  g_generation.fetch_add(1);
  return written;
}

bool TuningCache::remove(const TuningKey& key) const {
  bool found = false;
  rewrite(path_, [&](std::map<std::string, TuningEntry>& entries) {
    found = entries.erase(key.str()) > 0;
    return found;
  });
  g_generation.fetch_add(1);
  return found;
}

uint64_t tuning_generation() { return g_generation.load(std::memory_order_relaxed); }

std::optional<Config> tuned_config(const Kernel& k, const std::vector<ArgSpec>& specs, bool dynamic_shapes) {
  if (const char* off = std::getenv("TILEJIT_TUNING"); off && std::string_view(off) == "off") return std::nullopt;
  TuningCache cache(TuningCache::default_path());
  if (!signature_of(cache.path()).exists) return std::nullopt;
  TuningKey key = tuning_key(k, specs, dynamic_shapes, current_identity());
  auto e = cache.lookup(key);
  if (!e) return std::nullopt;
  return e->config;
}

}  // namespace tj::autotune

#pragma once
// The persistent tuning cache: the winning Config per
//   (kernel fingerprint, GPU name + compute capability, shape bucket, dtypes,
//    toolkit (NVRTC) + driver version),
// one JSON file (TuningCache::default_path(): <cache dir>/tuning.json) shared by every
// process of the user. tj::launch without an explicit config reads it; `tilejit tune` and
// autotune::tune() write it; export reads entries().
//
// Kernel fingerprint: XXH3-128 of ir::print() of the kernel traced at the shape bucket's
// representative shape (so every shape of a bucket has the same fingerprint, and any change
// of the kernel's code, dtypes or host-value specialization changes it). Stable across
// processes and builds as long as the traced IR is the same.
//
// Shape bucket: per tensor dimension, the exact size up to 256 (head dims, channel counts:
// code depends on them exactly) and the next power of two above (sequence lengths, token
// counts, GEMM M/N/K: 3000 and 4096 share the bucket 4096). Kernels whose trace rejects the
// rounded shape (e.g. a check that a dim divides another) fall back to the exact shape.
//
// File safety: writes take an exclusive flock on <file>.lock, re-read the file, merge the
// new entry and replace the file atomically (temporary file in the same directory, fsync,
// rename), so two processes tuning at once both keep their entries and readers see a
// complete old or new file. A file that is not valid JSON, is of another format version,
// or holds malformed entries is reported once on stderr ("tilejit: ignoring corrupt tuning
// cache <path>: <why>" / "... ignoring stale tuning cache entry ...") and ignored (the next
// store replaces it).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dsl/config.h"
#include "dsl/kernel.h"

namespace tj::autotune {

// What a tuned result is valid for besides the kernel and shape.
struct DeviceIdentity {
  std::string name;                 // "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;
  std::string arch;                 // NVRTC target: "sm_90a"
  int driver_version = 0;           // cuDriverGetVersion
  int nvrtc_version = 0;            // runtime::nvrtc_version()

  std::string device_str() const;   // "NVIDIA H100 80GB HBM3 (cc 9.0)"
  std::string toolkit_str() const;  // "nvrtc 13000, driver 13000"
};

// The identity of runtime::current_device() and this process's NVRTC (needs a GPU).
const DeviceIdentity& current_identity();

// The bucket of one dimension (see above); -1 (dynamic) stays -1.
int64_t bucket_dim(int64_t d);

struct TuningKey {
  std::string kernel;               // kernel name (for people; the fingerprint identifies it)
  std::string fingerprint;
  std::string device;               // DeviceIdentity::device_str()
  std::string bucket;               // "4x16x4096x128,4x16x4096x128,..." per tensor ("dyn:" prefix when traced with dynamic shapes)
  std::string dtypes;               // "e4m3,e4m3,e4m3,bf16"
  std::string toolkit;              // DeviceIdentity::toolkit_str()

  std::string str() const;          // the entry's name in the file
  bool operator==(const TuningKey&) const = default;
};

// The key for launching `k` with `specs` (concrete shapes; host values and runtime scalars
// as specs_for gives them). With `dynamic_shapes` the fingerprint is taken from the trace
// with every tensor dim dynamic (the kernel launch() compiles then) and the bucket still
// comes from the concrete shapes.
TuningKey tuning_key(const Kernel& k, const std::vector<ArgSpec>& specs, bool dynamic_shapes, const DeviceIdentity& device);

struct TuningEntry {
  TuningKey key;
  Config config;
  double ms = 0;                    // the winner's median time
  double default_ms = 0;            // the default config's
  std::string shape;                // the exact shapes it was tuned on
  std::string effort;               // "quick", "full", ...
  int candidates = 0;               // candidates measured
  int64_t created = 0;              // unix time
};

class TuningCache {
 public:
  static constexpr int kFormatVersion = 1;

  explicit TuningCache(std::filesystem::path file);
  // runtime::DiskCache::default_dir() / "tuning.json"
  static std::filesystem::path default_path();

  const std::filesystem::path& path() const { return path_; }

  // Reads go through a per-process memo of the parsed file, refreshed when the file's
  // size, modification time or inode changes.
  std::optional<TuningEntry> lookup(const TuningKey& key) const;
  std::vector<TuningEntry> entries() const;
  // Adds or replaces key's entry (locked read-merge-write, atomic replace); returns whether the
  // file now holds it. I/O failures print a warning and are otherwise ignored (the cache is an
  // optimization).
  bool store(const TuningEntry& entry) const;
  // Removes key's entry; returns whether it was there.
  bool remove(const TuningKey& key) const;

 private:
  std::filesystem::path path_;
};

// Bumped whenever this process stores or removes a tuning entry (launch plans built from
// older lookups are dropped).
uint64_t tuning_generation();

// The tuned config for launching `k` with `specs` on the current GPU from the default
// cache, or nullopt. $TILEJIT_TUNING=off disables tuned configs (launch uses the default).
std::optional<Config> tuned_config(const Kernel& k, const std::vector<ArgSpec>& specs, bool dynamic_shapes);

}  // namespace tj::autotune

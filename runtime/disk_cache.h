#pragma once
// On-disk cache of compiled artifacts (CUBINs, tuning results), shared by processes.
//
// One file per key, named by content_hash(key), in dir(). Each file holds a versioned
// header (magic "TJCACHE", format version, payload size, XXH64 of the payload, the key
// itself) and the payload. Writes are atomic (temporary file in the same directory, fsync,
// rename), so concurrent readers and writers in several processes see either a complete
// old entry or a complete new one. An entry that is corrupt, truncated, of another format
// version or for another key is reported on stderr ("tilejit: ignoring corrupt cache entry
// <path>: <why>"), removed, and treated as a miss so the caller rebuilds it.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace tj::runtime {

class DiskCache {
 public:
  static constexpr uint32_t kFormatVersion = 1;

  // The directory is created on the first put().
  explicit DiskCache(std::filesystem::path dir);

  // $TILEJIT_CACHE_DIR, else $XDG_CACHE_HOME/tilejit, else ~/.cache/tilejit (empty or,
  // for XDG_CACHE_HOME, relative values count as unset).
  static std::filesystem::path default_dir();

  const std::filesystem::path& dir() const { return dir_; }
  // Where `key`'s entry lives: dir()/<content_hash(key)>.tjc
  std::filesystem::path path_for(std::string_view key) const;

  // The payload stored under `key`, or nullopt on a miss (absent or rejected entry).
  std::optional<std::string> get(std::string_view key) const;
  // Stores `bytes` under `key`, replacing any previous entry. The cache is an
  // optimization: I/O failures (read-only or full disk) print a warning on stderr
  // ("tilejit: cannot write cache entry <path>: <why>") and are otherwise ignored.
  void put(std::string_view key, std::string_view bytes) const;
  // Removes `key`'s entry if present.
  void remove(std::string_view key) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace tj::runtime

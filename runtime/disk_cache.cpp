#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/atomic_file.h"
#include "runtime/hash.h"

namespace tj::runtime {
namespace fs = std::filesystem;
namespace {

// File layout, integers little-endian:
//   0  char[8]  "TJCACHE\0"
//   8  u32      format version
//  12  u32      key size K
//  16  u64      payload size P
//  24  u64      XXH64(payload)
//  32  K bytes  key
//  32+K P bytes payload
constexpr char kMagic[8] = {'T', 'J', 'C', 'A', 'C', 'H', 'E', '\0'};
constexpr size_t kHeaderSize = 32;

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const std::string& in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

std::string errno_text(int err) { return std::strerror(err); }

void warn(const std::string& message) {
  // One fputs call so lines from several threads do not interleave.
  std::string line = "tilejit: " + message + "\n";
  std::fputs(line.c_str(), stderr);
}

void read_all(int fd, std::string& out, size_t size) {
  out.resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
}

// Why `file` is not a valid entry for `key`, or "" when it is.
std::string validate(const std::string& file, std::string_view key) {
  if (file.size() < kHeaderSize)
    return fmt::format("truncated header ({} of {} bytes)", file.size(), kHeaderSize);
  if (std::memcmp(file.data(), kMagic, sizeof(kMagic)) != 0) return "bad magic (not a tilejit cache file)";
  uint32_t version = static_cast<uint32_t>(get_le(file, 8, 4));
  if (version != DiskCache::kFormatVersion)
    return fmt::format("format version {}, expected {}", version, DiskCache::kFormatVersion);
  uint64_t key_size = get_le(file, 12, 4);
  uint64_t payload_size = get_le(file, 16, 8);
  if (payload_size > file.size() || kHeaderSize + key_size + payload_size > file.size()) {
    return fmt::format("truncated ({} bytes; the header describes a {}-byte key and a {}-byte "
                       "payload)", file.size(), key_size, payload_size);
  }
  if (kHeaderSize + key_size + payload_size < file.size())
    return fmt::format("{} unexpected trailing bytes",
                       file.size() - (kHeaderSize + key_size + payload_size));
  if (std::string_view(file).substr(kHeaderSize, key_size) != key)
    return "entry belongs to another key";
  std::string_view payload = std::string_view(file).substr(kHeaderSize + key_size);
  if (checksum64(payload) != get_le(file, 24, 8)) return "payload checksum mismatch";
  return "";
}

fs::path home_dir() {
  if (const char* h = std::getenv("HOME"); h && *h) return h;
  struct passwd pw;
  struct passwd* result = nullptr;
  char buf[4096];
  if (getpwuid_r(getuid(), &pw, buf, sizeof(buf), &result) == 0 && result && result->pw_dir)
    return result->pw_dir;
  return {};
}

}  // namespace

DiskCache::DiskCache(fs::path dir) : dir_(std::move(dir)) {}

fs::path DiskCache::default_dir() {
  if (const char* d = std::getenv("TILEJIT_CACHE_DIR"); d && *d) return fs::path(d);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x && fs::path(x).is_absolute())
    return fs::path(x) / "tilejit";
  fs::path home = home_dir();
  if (!home.empty()) return home / ".cache" / "tilejit";
  return fs::temp_directory_path() / fmt::format("tilejit-cache-{}", static_cast<long>(getuid()));
}

fs::path DiskCache::path_for(std::string_view key) const {
  return dir_ / (content_hash(key) + ".tjc");
}

std::optional<std::string> DiskCache::get(std::string_view key) const {
  fs::path path = path_for(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && errno != ENOTDIR)
      warn(fmt::format("cannot read cache entry {}: {}", path.string(), errno_text(errno)));
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    warn(fmt::format("cannot read cache entry {}: {}", path.string(), errno_text(err)));
    return std::nullopt;
  }
  std::string file;
  read_all(fd, file, static_cast<size_t>(st.st_size));
  ::close(fd);
  std::string why = validate(file, key);
  if (why.empty()) {
    return file.substr(kHeaderSize + key.size());
  }
  warn(fmt::format("ignoring corrupt cache entry {}: {}", path.string(), why));
  // Remove the entry we read, not one another process renamed into place meanwhile.
  struct stat now {};
  if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev)
    ::unlink(path.c_str());
  return std::nullopt;
}

void DiskCache::put(std::string_view key, std::string_view bytes) const {
  fs::path path = path_for(key);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    warn(fmt::format("cannot write cache entry {}: cannot create {}: {}", path.string(),
                     dir_.string(), ec.message()));
    return;
  }
  if (key.size() > 0xffffffffu) {
    warn(fmt::format("cannot write cache entry {}: key too long", path.string()));
    return;
  }
  std::string header;
  header.reserve(kHeaderSize + key.size());
  header.append(kMagic, sizeof(kMagic));
  put_le(header, kFormatVersion, 4);
  put_le(header, key.size(), 4);
  put_le(header, bytes.size(), 8);
  put_le(header, checksum64(bytes), 8);
  header.append(key);

  const std::string why = replace_file(path, {header, bytes});
  if (!why.empty()) warn(fmt::format("cannot write cache entry {}: {}", path.string(), why));
}

void DiskCache::remove(std::string_view key) const {
  std::error_code ec;
  fs::remove(path_for(key), ec);
}

}  // namespace tj::runtime

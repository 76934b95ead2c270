#pragma once
// Replacing a file so that a reader sees its old contents or all of the new ones, never a part
// (the kernel disk cache and the tuning cache, which several processes may write at once): a
// temporary file beside it under a name no other process or thread takes, flushed to disk,
// renamed over it, and the rename made durable by flushing the folder.
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

namespace tj::runtime {

// Writes `pieces` one after another as the new `path`. Returns "" on success, else why not (the
// system's error text); the temporary file is gone then and `path` unchanged. The folder must
// exist.
std::string replace_file(const std::filesystem::path& path, std::initializer_list<std::string_view> pieces);

}  // namespace tj::runtime

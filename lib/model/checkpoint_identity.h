// The identity of a checkpoint's weights, for keys of KV that outlives a
// process (the L3 tier: a shared store outlives model swaps, and one store
// may serve workers of several checkpoints).
//
// CheckpointIdentity(dir): XXH3 of config.json and of every *.safetensors
// file's whole content (each file hashed, then the names and hashes), so two
// checkpoints that differ in any weight byte never share a key, whatever
// their file names and sizes. The files are read in parallel, a thread per
// file up to the machine's cores (called after the weights were loaded, it
// reads the page cache; it logs the time taken). NotFound when the
// directory cannot be listed, Internal when a file cannot be read.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace swaserve::model {

absl::StatusOr<uint64_t> CheckpointIdentity(const std::string& dir);

}  // namespace swaserve::model

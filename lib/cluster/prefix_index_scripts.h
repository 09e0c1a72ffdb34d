// The Lua scripts of the prefix-affinity index (prefix_index.h), loaded once
// per connection and called by EVALSHA. Each function documents its KEYS and
// ARGV; PrefixIndex builds them.
//
// Ownership: the scripts are static and live for the process.
// Thread-safety: thread-safe (immutable after first use).
#pragma once

#include "lib/cluster/redis_client.h"

namespace swaserve::cluster::prefix_scripts {

const RedisScript& ApplyScript();
const RedisScript& StreamScript();
const RedisScript& DispatchScript();
const RedisScript& MatchScript();
const RedisScript& ExtendScript();
const RedisScript& SizesScript();

}  // namespace swaserve::cluster::prefix_scripts

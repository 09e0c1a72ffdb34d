// Who a peer process is, and whether it is still alive (internal to
// lib/transfer). UCX 1.13 does not notice a dead shared-memory peer (a
// rendezvous to a SIGKILLed process stays pending forever), so the engine
// checks, every keepalive_interval, whether the process of each peer on this
// host still exists: same boot id and pid namespace, pid and start time from
// /proc. Peers on other hosts are left to UCX's own failure detection.
//
// Pure functions over /proc; thread-safe.
#pragma once

#include <cstdint>

#include "lib/transfer/wire.h"

namespace swaserve::transfer::internal {

// Fields 3 (state) and 22 (start time, clock ticks) of /proc/<pid>/stat;
// false when the process does not exist (or the file does not parse).
bool ReadProcStat(uint64_t pid, char* state, uint64_t* start_time);

// This process: boot id hash, pid namespace inode, pid and start time. The
// boot id is zero (unknown: never declared gone) when /proc cannot be read.
wire::ProcessIdentity SelfIdentity();

// True when `peer` runs on this host, in our pid namespace, and its process
// has exited (or is a zombie, or its pid now names another process). False
// when that cannot be known (unknown identity, another host or namespace).
bool ProcessGone(const wire::ProcessIdentity& peer,
                 const wire::ProcessIdentity& self);

}  // namespace swaserve::transfer::internal

// Process-wide signal dispositions shared by the libraries that own sockets
// (lib/cluster's Redis client, lib/metrics' HTTP server).
//
// Thread-safety: safe to call from any thread, any number of times; it
// changes the process's disposition of SIGPIPE, which every thread shares.
#pragma once

namespace swaserve::base {

// Makes the process ignore SIGPIPE if SIGPIPE still has its default
// disposition (terminate), so that a write to a peer that closed its socket
// fails with EPIPE instead of killing the process. A handler or an ignore
// the program installed itself is left alone.
void IgnoreSigpipeIfDefault();

}  // namespace swaserve::base

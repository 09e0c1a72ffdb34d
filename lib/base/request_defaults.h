// Request defaults every layer shares (the router, its OpenAI front, the
// decode workers, the CLI), declared once so they cannot drift.
// Constants only: thread-safe.
#pragma once

namespace swaserve::base {

// max_tokens of a request that gives none (or 0).
inline constexpr int kDefaultMaxTokens = 256;

}  // namespace swaserve::base

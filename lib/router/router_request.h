// Router::Request: one client request's state across its legs, retries and
// migrations, and the helpers its parts share. Internal to lib/router
// (router.cc: preparation and decision; router_call.cc: the asynchronous run;
// router_media.cc: its multimodal items). Not thread-safe: owned by the
// request's Call, whose steps touch it one at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lib/cluster/cluster_view.h"
#include "lib/base/hash.h"
#include "lib/router/router.h"
#include "lib/router/text_stream.h"

namespace swaserve::router {

// Steady-clock nanoseconds (request timings).
int64_t NowNanos();
// A worker incarnation: id + the random incarnation of its record (what a
// request excludes after that worker failed it).
std::string ExclusionKey(const cluster::WorkerInfo& i);
// ResourceExhausted (OVERLOADED, retryable) telling the client when to come
// back (ErrorDetail.retry_after_ms: the HTTP API's Retry-After).
absl::Status Overloaded(std::string message, double retry_after_seconds);

// A decision: the two workers of an attempt.
struct Router::Choice {
  std::shared_ptr<const WorkerEndpoint> prefill;
  std::shared_ptr<const WorkerEndpoint> decode;
  int64_t expected_cached_tokens = 0;
};

struct Router::Request {
  std::string id;
  std::vector<uint32_t> tokens;
  // Resolved multimodal items (embeddings, spans in `tokens`) and their page
  // hash spans; a migration keeps them (they lie in the prompt part).
  std::vector<v1::MultimodalItem> media;
  std::vector<base::HashedSpan> spans;
  // The client's items (their bytes), to encode again inline when a
  // by-reference embedding cannot be fetched; media_inline once done.
  std::vector<v1::MultimodalItem> media_source;
  bool media_inline = false;
  v1::SamplingParams sampling;
  int32_t priority = 0;
  // Who sent it (its cache domain, priority floor, token admission), and
  // the chain seed of the request's page hashes:
  // base::PageHashSeedFor(caller.cache_domain, cache_salt).
  Caller caller;
  uint64_t page_hash_seed = 0;
  // GenerateRequest.cache_key: ties between prefill workers go by its hash,
  // so a session's turns keep to one worker when nothing else decides.
  std::string cache_key;
  // The chat prompt leaves a reasoning block open (PromptInfo).
  bool opens_reasoning = false;
  // Prompt prefixes to keep (the chat's cache breakpoints), for prefill.
  std::vector<v1::CachePin> cache_pins;
  int bucket = 0;
  std::string bucket_label;
  int64_t start_ns = 0;
  absl::Time deadline;
  // Worker incarnations (ExclusionKey) that failed this request: a worker
  // restarted under the same id is a new incarnation and eligible again.
  absl::flat_hash_set<std::string> excluded_prefill;
  absl::flat_hash_set<std::string> excluded_decode;
  // Page hashes per page size (workers normally share one).
  int hash_page_size = 0;
  std::vector<uint64_t> hashes;
  int attempt = 0;
  // Output so far (the first token reaching the client ends retries).
  bool sent_any = false;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_tokens = 0;
  // The client's prompt length and max_tokens; `tokens` grows by the tokens
  // already sent when the request migrates (generated[0, generated_in_tokens)
  // are in `tokens`).
  uint32_t prompt_tokens = 0;
  uint32_t max_tokens = 0;
  std::vector<uint32_t> generated;
  size_t generated_in_tokens = 0;
  int migrations = 0;
  // MTP draft tokens proposed / accepted: of the legs before a migration,
  // and of the current leg as its last chunk said (TokenChunk's are
  // cumulative per leg).
  uint32_t draft_tokens_before = 0;
  uint32_t accepted_draft_tokens_before = 0;
  uint32_t leg_draft_tokens = 0;
  uint32_t leg_accepted_draft_tokens = 0;
  // Detokenization across legs (a migrated stream continues mid-text).
  std::unique_ptr<TextStream> text;
};

}  // namespace swaserve::router

// WorkerOptions: every option of a worker process (swaserve-prefill,
// swaserve-decode, swaserve-worker), declared once with its default, and
// registered as flags / config-file keys by AddWorkerFlags. The services'
// wiring (services/worker/worker_server.h) reads only this struct.
//
// A plain struct: thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lib/base/request_defaults.h"
#include "lib/base/config.h"
#include "lib/kv/kv_shape.h"
#include "lib/sched/prefill_scheduler.h"

namespace swaserve::worker {

struct WorkerOptions {
  // Every field is a flag / config key; AddWorkerFlags documents each.
  std::string role = "both";
  std::string model;
  std::string worker_id;
  std::string listen = "127.0.0.1:0";
  std::string metrics_host = "127.0.0.1";
  int64_t metrics_port = 0;
  std::string port_file;
  std::string log_level;
  int64_t threads = 0;
  int64_t page_size = 16;
  int64_t prefill_kv_mib = 256;
  int64_t decode_kv_mib = 256;
  double swa_full_ratio = 0.25;
  // Prefill L2 tier (host memory; kv::PrefixCacheOptions::l2): its bytes as
  // a multiple of the prefill KV pool's (0: no L2), and its own SWA/full
  // token ratio (it holds only trailing windows).
  double l2_ratio = 2.0;
  double l2_swa_full_ratio = 0.1;
  int64_t load_back_min_tokens = 64;
  int64_t async_load_back_min_bytes = int64_t{1} << 20;
  // L3 tier of the prefill prefix cache (kv::PrefixCache "L3"): "" (none),
  // "file:<dir>" (a local FilePageStore bounded by l3_mib; a restarted
  // worker comes back warm) or "redis:<host:port>" (a RedisPageStore shared
  // by the workers; give it its own Redis with maxmemory + allkeys-lru, not
  // the registry's). Needs an L2 (kv.l2_ratio > 0).
  std::string l3;
  // A redis: L3's credentials (cluster::RedisOptions::password_file and
  // username): a file holding its password, and its ACL user. Default: none.
  std::string l3_redis_password_file;
  std::string l3_redis_username;
  // A file holding the secret key (>= 32 bytes) of the L3 pages' MACs
  // (kv::PageBlobMac): pages are written with a MAC and read only when it
  // verifies, so that whoever can write to a shared L3 cannot plant KV.
  // Every worker sharing an L3 needs the same key. Empty (default): none.
  std::string l3_mac_key_file;
  int64_t l3_mib = 8192;
  // Bound of the L3 write-behind queue (kv::AsyncPageStore): page bytes
  // copied for the store's thread. Write-through waits for room (near a
  // bucket's bound: kv::PrefixCache::ContinueL3Writes; after hits: a later
  // hit); a write-back of pages leaving the cache beyond it is dropped
  // (counted).
  int64_t l3_queue_mib = 256;
  int64_t l3_write_through_hits = 2;
  // PrefixCacheOptions::l3_write_through_from_tokens as a fraction of
  // max_prompt_tokens (the bucket's bound): a prompt at least this far up
  // its bucket is written through to L3 at its insert, so that when it
  // grows past the bound (an agent's next turn) the next bucket's worker
  // finds it in the shared L3. 0 (default): off; also off without an L3 or
  // a bound. `swaserve up` sets 0.75 for every bucket but the last.
  double l3_write_through_near_bound = 0;
  int64_t l3_prefetch_min_tokens = 256;
  int64_t l3_prefetch_max_wait_ms = 200;
  double l3_prefetch_wait_fraction = 0.5;
  double l3_prefetch_assumed_tokens_per_second = 2000;
  std::string policy = "compute_aware";
  // Library defaults (lib/sched/prefill_scheduler.h); scale aging with the
  // worker's prefill throughput (about 0.1x tokens/s, bench/RESULTS.md).
  double aging_tokens_per_second = sched::PrefillSchedulerOptions{}.aging_tokens_per_second;
  int64_t max_partial_requests = sched::PrefillSchedulerOptions{}.max_partial_requests;
  double fcfs_wait_ratio = sched::PrefillSchedulerOptions{}.fcfs_wait_ratio;
  double context_cost_per_token = -1;  // < 0: from the model
  int64_t chunk_tokens = 512;
  int64_t step_token_budget = 2048;
  int64_t max_requests_per_step = 8;
  int64_t max_prompt_tokens = 0;
  // PrefillCoreOptions::window_restore_min_saved_work (< 0: off).
  double window_restore_min_saved_work = 64;
  // PrefillCoreOptions::window_restore_pyramid.
  bool window_restore_pyramid = true;
  // PrefillCoreOptions::keep_cancelled_chunks.
  bool keep_cancelled_chunks = true;
  // PrefillCoreOptions::l3_checkpoint_tokens (0: off; only with --kv.l3).
  int64_t l3_checkpoint_tokens = 16384;
  // PrefillCoreOptions::cache_pin_max_fraction (0: cache breakpoints are
  // not pinned).
  double cache_pin_max_fraction = 0.25;
  // PrefillCoreOptions::window_restore_from_window_safe.
  bool window_restore_from_window_safe = true;
  // PrefixCacheOptions::cold_superseded_windows, where windows are restored
  // (window_restore_min_saved_work >= 0): a superseded window is cheap to
  // restore, so it is evicted before any window still at a prompt's end.
  bool cold_superseded_windows = true;
  // PrefillCoreOptions::swa_checkpoint_tokens (0: off). 2048 is the best of
  // 1K-8K on the Mooncake trace replay (bench/RESULTS.md, window restore).
  int64_t swa_checkpoint_tokens = 2048;
  // PrefillCoreOptions::swa_checkpoints_yield.
  bool swa_checkpoints_yield = true;
  int64_t max_batch_size = 32;
  // MTP speculative decoding (lib/worker/mtp_drafter.h MtpOptions, whose
  // defaults these repeat).
  int64_t mtp_draft_tokens = -1;
  bool mtp_adaptive = true;
  double mtp_draft_cost = 0.3;
  // MtpOptions::draft_vocab_tokens.
  int64_t mtp_draft_vocab_tokens = -1;
  int64_t default_max_tokens = base::kDefaultMaxTokens;
  int64_t max_max_tokens = 1 << 20;
  absl::Duration commit_timeout = absl::Seconds(60);
  int64_t staging_arena_mib = 1024;
  int64_t staging_budget_mib = 4096;
  absl::Duration transfer_timeout = absl::Seconds(30);
  std::string ucx_tls;
  absl::Duration drain = absl::Seconds(10);
  // This long before the drain deadline (at most half the drain), a prefill
  // worker ends the prefills still computing itself (PrefillCore::
  // EndAllForDrain): what they computed goes to its prefix cache and L3,
  // and each answers DRAINING once those writes are stored (waiting at most
  // three quarters of this), so the router's retry elsewhere resumes from
  // L3. 0: off (the deadline cancels them).
  absl::Duration drain_handback = absl::Seconds(3);
  std::string redis;
  // The registry Redis's credentials (cluster::RedisOptions::password_file
  // and username): a file holding its password (AUTH on every connection),
  // and its ACL user. Default: none.
  std::string redis_password_file;
  std::string redis_username;
  std::string cluster = "default";
  std::string advertise_host = "127.0.0.1";
  std::string model_name = "swaserve";
  int64_t bucket = 0;
  int64_t bucket_min_tokens = 0;
};

// Registers every field of *o as a key of `config` (`--kv.page_size=16`,
// `kv: {page_size: 16}` in a file), each under `prefix` (`swaserve up` uses
// "workers.prefill." and "workers.decode."). *o must outlive `config`.
void AddWorkerFlags(base::Config* config, WorkerOptions* o, absl::string_view prefix = "");

// The flags that give a worker process `o` (every option that differs from
// WorkerOptions' defaults), for a launcher.
std::vector<std::string> WorkerFlags(WorkerOptions o);

// Checks the values AddWorkerFlags cannot (role, policy, sizes) and fills
// nothing else (worker_id stays empty when not given: the caller derives it).
// InvalidArgument naming the flag.
absl::Status FinishWorkerOptions(WorkerOptions* o);

// A prefill side with a bucket (max_prompt_tokens > 0) must hold one prompt
// of the bucket's largest size in its full pool, and a step's SWA working
// set (PrefillSwaWorkingTokens) in its SWA pool, or prompts near the top of
// the bucket would be refused (HTTP 413 or 503) by a worker that advertises
// it. FailedPrecondition naming the least --kv.prefill_mib that holds it for
// `shape` (the model's KV shape at --kv.page_size) and swa_full_ratio; OK
// without a bucket or a prefill side.
absl::Status CheckPrefillPoolHoldsBucket(const WorkerOptions& o, const kv::KvShape& shape);

// SWA tokens one request's prefill step needs at once: a chunk
// (prefill.chunk_tokens) after the window before it, plus a page of
// alignment. A prefill pool whose SWA pool holds fewer cannot compute a
// prompt longer than that, whatever its full pool holds.
int64_t PrefillSwaWorkingTokens(const WorkerOptions& o, const kv::KvShape& shape);

// kv::PrefixCacheOptions::l3_write_through_from_tokens for a prefill side:
// ceil(l3_write_through_near_bound x max_prompt_tokens), 0 (off) without an
// L3, a bucket bound or the fraction.
int L3WriteThroughFromTokens(const WorkerOptions& o);

inline bool HasPrefill(const WorkerOptions& o) { return o.role == "prefill" || o.role == "both"; }
inline bool HasDecode(const WorkerOptions& o) { return o.role == "decode" || o.role == "both"; }

}  // namespace swaserve::worker

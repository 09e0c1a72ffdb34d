// swaserve kv-plan: the KV pool (MiB) each worker needs so that every
// length bucket can be served (lib/launch/kv_plan.h): what `swaserve up`
// gives its workers, and what an operator sizes --kv.prefill_mib /
// --kv.decode_mib (and the pods' memory) by in a deployment.
//
//   swaserve kv-plan --model=models/demo
//   swaserve kv-plan --model=DIR --buckets=65536,262144,1048576 --json
//
// One line per prefill bucket and one for the decode workers; --json prints
// {"prefill": [{"min_tokens", "max_tokens", "mib", "holds_tokens"}, ...],
//  "decode": {"mib", "holds_tokens"}} for scripts (tests/deploy checks the
// Kubernetes manifests with it).
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "lib/base/config.h"
#include "lib/launch/cluster_launcher.h"
#include "lib/launch/kv_plan.h"
#include "lib/worker/worker_options.h"
#include "tools/swaserve/commands.h"

namespace swaserve::cli {

int KvPlan(int argc, const char* const* argv) {
  std::string model;
  std::vector<int64_t> buckets = launch::ClusterSpec{}.bucket_bounds;
  int64_t min_mib = 1;
  double swa_full_ratio = 0.25;
  int64_t page_size = 16;
  int64_t chunk_tokens = 512;
  double l2_ratio = worker::WorkerOptions{}.l2_ratio;
  bool json = false;
  base::Config config(
      "swaserve kv-plan",
      "Prints the KV pool (MiB) each worker needs for one prompt at the top of its length "
      "bucket: prefill workers per bucket, decode workers for the largest bucket plus 8K "
      "generated tokens, and each prefill worker's L2 tier (host memory the prefix cache "
      "fills as it demotes pages). Pool memory is used only as prompts and the cache fill it; "
      "size the pods' memory limits for pool + L2. Exit 0, 1 for an unreadable model, 2 for "
      "bad flags.");
  config.Add("model", &model, "checkpoint directory (config.json)")
      .Add("buckets", &buckets, "exclusive upper bounds of the prompt-length buckets (tokens)")
      .Add("kv_mib", &min_mib, "the least pool any worker gets (MiB)")
      .Add("swa_full_ratio", &swa_full_ratio, "the workers' --kv.swa_full_ratio")
      .Add("page_size", &page_size, "the workers' --kv.page_size")
      .Add("chunk_tokens", &chunk_tokens, "the prefill workers' --prefill.chunk_tokens")
      .Add("l2_ratio", &l2_ratio, "the prefill workers' --kv.l2_ratio (0: no L2 tier)")
      .Add("json", &json, "print JSON");
  base::ParseConfigOrExit(config, argc, argv);
  if (model.empty()) {
    std::fprintf(stderr, "swaserve kv-plan: --model is required\n");
    return 2;
  }
  if (absl::Status s = launch::ValidateBucketBounds(buckets); !s.ok()) {
    std::fprintf(stderr, "swaserve kv-plan: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (min_mib < 1 || !(swa_full_ratio > 0) || page_size < 1 || chunk_tokens < 1 ||
      !(l2_ratio >= 0)) {
    std::fprintf(stderr,
                 "swaserve kv-plan: kv_mib, swa_full_ratio, page_size and chunk_tokens must be "
                 "positive, l2_ratio >= 0\n");
    return 2;
  }
  const std::vector<std::string> flags = {
      absl::StrCat("--kv.swa_full_ratio=", swa_full_ratio),
      absl::StrCat("--kv.page_size=", page_size),
      absl::StrCat("--prefill.chunk_tokens=", chunk_tokens),
      absl::StrCat("--kv.l2_ratio=", l2_ratio)};
  absl::StatusOr<launch::KvPlan> plan =
      launch::PlanKvPoolsForModel(model, buckets, min_mib, /*fit_buckets=*/true, flags, flags);
  if (!plan.ok()) {
    std::fprintf(stderr, "swaserve kv-plan: %s\n", std::string(plan.status().message()).c_str());
    return 1;
  }
  if (json) {
    nlohmann::json out = {{"prefill", nlohmann::json::array()},
                          {"decode", {{"mib", plan->decode_mib},
                                      {"holds_tokens", plan->decode_tokens}}}};
    for (size_t i = 0; i < buckets.size(); ++i) {
      out["prefill"].push_back({{"min_tokens", i == 0 ? 0 : buckets[i - 1]},
                                {"max_tokens", buckets[i]},
                                {"mib", plan->prefill_mib[i]},
                                {"holds_tokens", plan->prefill_tokens[i]},
                                {"l2_mib", plan->prefill_l2_mib[i]}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    std::printf("prefill bucket %zu [%lld, %lld) tokens: --kv.prefill_mib=%lld (holds %lld tokens)"
                " + L2 %lld MiB\n",
                i, static_cast<long long>(i == 0 ? 0 : buckets[i - 1]),
                static_cast<long long>(buckets[i]), static_cast<long long>(plan->prefill_mib[i]),
                static_cast<long long>(plan->prefill_tokens[i]),
                static_cast<long long>(plan->prefill_l2_mib[i]));
  }
  std::printf("decode (largest bucket + %lld generated): --kv.decode_mib=%lld (holds %lld tokens)\n",
              static_cast<long long>(launch::kDecodeHeadroomTokens),
              static_cast<long long>(plan->decode_mib), static_cast<long long>(plan->decode_tokens));
  return 0;
}

}  // namespace swaserve::cli

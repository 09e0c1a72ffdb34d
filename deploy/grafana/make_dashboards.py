#!/usr/bin/env python3
"""Writes the swaserve Grafana dashboards (dashboards/*.json) from one list of
panels, so the JSON stays consistent and the tests (tests/deploy) can read
every panel's PromQL from the same files Grafana loads.

    python3 deploy/grafana/make_dashboards.py       # rewrites dashboards/*.json

Metric names are the services' /metrics (WORKSPACE.md); recording rules
(swaserve:*) come from deploy/prometheus/rules/swaserve.rules.yml.
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(title, exprs, unit="short", desc=""):
    return {"title": title, "exprs": exprs, "unit": unit, "description": desc}


DASHBOARDS = {
    "swaserve-overview": ("swaserve: latency and cache", [
        panel("TTFT P50 / P90 / P99 by length bucket", [
            ("histogram_quantile(0.5, sum by (le, bucket) (rate(swaserve_router_ttft_seconds_bucket[$__rate_interval])))", "p50 bucket {{bucket}}"),
            ("histogram_quantile(0.9, sum by (le, bucket) (rate(swaserve_router_ttft_seconds_bucket[$__rate_interval])))", "p90 bucket {{bucket}}"),
            ("histogram_quantile(0.99, sum by (le, bucket) (rate(swaserve_router_ttft_seconds_bucket[$__rate_interval])))", "p99 bucket {{bucket}}"),
        ], "s", "Time to first token at the router, from the request's arrival."),
        panel("TPOT P50 / P90 by length bucket", [
            ("histogram_quantile(0.5, sum by (le, bucket) (rate(swaserve_router_tpot_seconds_bucket[$__rate_interval])))", "p50 bucket {{bucket}}"),
            ("histogram_quantile(0.9, sum by (le, bucket) (rate(swaserve_router_tpot_seconds_bucket[$__rate_interval])))", "p90 bucket {{bucket}}"),
        ], "s", "Time per output token after the first."),
        panel("Requests by status code", [
            ("sum by (code) (rate(swaserve_router_requests_total[$__rate_interval]))", "{{code}}"),
        ], "reqps", "Final status of every request (OK, RESOURCE_EXHAUSTED, ...)."),
        panel("Load shed (429 with Retry-After)", [
            ("sum by (reason) (rate(swaserve_router_shed_total[$__rate_interval]))", "{{reason}}"),
        ], "reqps", "New requests the routers refused before any worker call: too many in flight (inflight) or every prefill worker of the bucket over --shed_backlog_seconds of queued prefill (backlog)."),
        panel("Prefix-cache hit rate: cluster and per bucket", [
            ("sum(rate(swaserve_router_cached_tokens_total[$__rate_interval])) / sum(rate(swaserve_router_prompt_tokens_total[$__rate_interval]))", "cluster"),
            ("sum by (bucket) (rate(swaserve_router_cached_tokens_total[$__rate_interval])) / sum by (bucket) (rate(swaserve_router_prompt_tokens_total[$__rate_interval]))", "bucket {{bucket}}"),
        ], "percentunit", "Cached / prompt tokens of completed requests (usage.cached_tokens)."),
        panel("Prefix-cache hit rate per prefill worker", [
            ("sum by (instance) (rate(swaserve_prefix_cache_hit_tokens_total[$__rate_interval])) / sum by (instance) (rate(swaserve_prefix_cache_lookup_tokens_total[$__rate_interval]))", "{{instance}}"),
        ], "percentunit", "Window-safe hit tokens / looked-up tokens of each worker's prefix cache."),
        panel("Tokens lost to the window-safe rule, and window restores", [
            ("sum(rate(swaserve_prefix_cache_window_lost_tokens_total[$__rate_interval]))", "window-lost tokens/s"),
            ("sum(rate(swaserve_prefill_window_restore_saved_tokens_total[$__rate_interval]))", "recompute saved by restores, tokens/s"),
            ("sum(rate(swaserve_prefill_window_restore_tokens_total[$__rate_interval]))", "restored stretch tokens/s"),
            ("sum(rate(swaserve_prefill_swa_checkpoint_pages_yielded_total[$__rate_interval]))", "SWA checkpoint pages yielded/s"),
        ], "short", "Full-KV matches not window-safe, what window restore recovers, and checkpoint windows running prompts gave up before hot ones."),
        panel("Router decisions by reason", [
            ("sum by (leg, reason) (rate(swaserve_router_decisions_total[$__rate_interval]))", "{{leg}} {{reason}}"),
        ], "ops", "Why each prefill/decode worker was chosen (cache affinity, load, hotspot guard)."),
        panel("Migrations and retries", [
            ("sum by (reason) (rate(swaserve_router_migrations_total[$__rate_interval]))", "migration {{reason}}"),
            ("sum by (leg) (rate(swaserve_router_retries_total[$__rate_interval]))", "retry {{leg}}"),
            ("sum(rate(swaserve_prefill_partial_kept_requests_total[$__rate_interval]))", "prefill cut short, its chunks kept"),
            ("sum(rate(swaserve_prefill_l3_checkpoints_total[$__rate_interval]))", "L3 checkpoint of a long prefill"),
            ("sum(rate(swaserve_prefill_l3_checkpoints_skipped_total[$__rate_interval]))", "L3 checkpoint put off (no room)"),
        ], "ops", "Streams moved to another worker pair, and retried worker calls. Prefills cut short (the client or router went away, the decode worker died) whose computed chunks stayed in the prefix cache, so that the retry resumes there (swaserve_prefill_partial_kept_tokens_total counts the tokens). L3 checkpoints: long prefills writing their computed KV to L3 as they go, so that a retry after a worker is killed resumes there; put off when the L3 write-behind queue is full."),
        panel("Router index mirror", [
            ("sum by (instance) (swaserve_index_mirror_workers)", "workers mirrored {{instance}}"),
            ("sum by (instance) (rate(swaserve_index_mirror_events_total[$__rate_interval]))", "events/s {{instance}}"),
            ("sum by (instance) (rate(swaserve_index_mirror_snapshots_total[$__rate_interval]))", "snapshots/s {{instance}}"),
            ("sum by (instance) (swaserve_index_mirror_entries)", "entries {{instance}}"),
            ("sum by (instance) (rate(swaserve_router_mirror_fallbacks_total[$__rate_interval]))", "decisions on the copy alone (Redis unreadable)/s {{instance}}"),
        ], "short", "Each router's in-memory copy of the prefix index (--index_mirror, the default): workers it holds, KV events it applies, snapshots it takes, and page hashes it holds (about 40 bytes of router memory per page) — new workers, or a gap in a stream (lost events, a Redis restart or failover); snapshots that keep coming mean the streams are being trimmed before the router reads them. Decisions on the copy alone: Redis could not be read, and the copy kept the prefix affinity (no predictions, no fresh loads)."),
    ]),
    "swaserve-workers": ("swaserve: workers, KV and MTP", [
        panel("KV pool usage: full vs SWA", [
            ("sum by (pool, state) (swaserve_kv_pages)", "{{pool}} {{state}}"),
        ], "short", "Pages per pool and state (free, reserved, in use, cached) over all workers."),
        panel("Prefill queue", [
            ("sum by (instance) (swaserve_sched_queued_tokens)", "queued tokens {{instance}}"),
            ("sum by (instance) (swaserve_prefill_running_requests)", "running {{instance}}"),
        ], "short", "Uncached tokens waiting in each prefill scheduler, and requests computing or shipping."),
        panel("Decode: staged and running requests, staging bytes", [
            ("sum by (instance) (swaserve_decode_staged_requests)", "staged {{instance}}"),
            ("sum by (instance) (swaserve_decode_running_requests)", "running {{instance}}"),
            ("sum by (instance, state) (swaserve_decode_staging_budget_bytes)", "staging bytes {{state}} {{instance}}"),
        ], "short", "KV staged in host memory until admitted; the staging budget."),
        panel("Prefix-cache tiers: hits by tier, load-backs, L3 prefetches", [
            ("sum by (tier) (rate(swaserve_prefill_cached_tokens_by_tier_total[$__rate_interval]))", "hit tokens/s {{tier}}"),
            ("sum(rate(swaserve_prefix_cache_loaded_back_bytes_total[$__rate_interval]))", "L2 -> L1 bytes/s"),
            ("sum by (result) (rate(swaserve_prefill_l3_prefetch_total[$__rate_interval]))", "L3 prefetches/s {{result}}"),
            ("sum by (op) (rate(swaserve_prefix_cache_l3_pages_total{op=~\"written|written_at_bound|write_errors\"}[$__rate_interval]))", "L3 pages/s {{op}}"),
        ], "short", "Cached prompt tokens by the tier they were in on arrival (l1; l2 host memory; l3 store), bytes loaded back from L2, L3 prefetch outcomes, and full pages written to L3 (all; of those, prompts near their bucket's bound; writes refused or dropped)."),
        panel("KV transfer bandwidth", [
            ("sum by (instance) (rate(swaserve_kv_transfer_bytes_total[$__rate_interval]))", "{{instance}}"),
        ], "Bps", "Bytes of KV shipped over UCX."),
        panel("MTP acceptance", [
            ("sum(rate(swaserve_decode_mtp_accepted_tokens_total[$__rate_interval])) / sum(rate(swaserve_decode_mtp_drafted_tokens_total[$__rate_interval]))", "accepted / drafted"),
            ("sum by (position) (rate(swaserve_decode_mtp_position_accepted_total[$__rate_interval])) / sum by (position) (rate(swaserve_decode_mtp_position_drafted_total[$__rate_interval]))", "position {{position}}"),
        ], "percentunit", "Share of drafted tokens the main model accepted, overall and per draft position."),
        panel("Decode throughput", [
            ("sum by (instance) (rate(swaserve_decode_generated_tokens_total[$__rate_interval]))", "{{instance}}"),
        ], "short", "Generated tokens per second per decode worker."),
        panel("Process memory: RSS, heap allocated, heap free", [
            ("sum by (instance) (process_resident_memory_bytes)", "RSS {{instance}}"),
            ("sum by (instance) (swaserve_process_heap_allocated_bytes)", "heap allocated {{instance}}"),
            ("sum by (instance) (swaserve_process_heap_free_bytes)", "heap free (kept by malloc) {{instance}}"),
        ], "bytes", "Resident memory of every swaserve process, and what malloc has handed out (a leak grows this) and holds free in its arenas (RSS kept without use: glibc keeps freed blocks per thread arena, so RSS can step up while allocated bytes stay flat)."),
        panel("Process CPU", [
            ("sum by (instance) (rate(process_cpu_seconds_total[$__rate_interval]))", "{{instance}}"),
        ], "short", "CPU cores busy per swaserve process (user + system)."),
        panel("Open circuit breakers (routers)", [
            ("sum(swaserve_router_open_breakers)", "open breakers"),
        ], "short", "Workers the routers stopped calling after repeated failures."),
        panel("Encoder: batch size, queue wait, preprocessing", [
            ("sum by (modality) (rate(swaserve_encoder_batch_items_sum[$__rate_interval])) / sum by (modality) (rate(swaserve_encoder_batch_items_count[$__rate_interval]))", "items per batch {{modality}}"),
            ("histogram_quantile(0.9, sum by (le, modality) (rate(swaserve_encoder_queue_wait_seconds_bucket[$__rate_interval])))", "queue wait P90 (s) {{modality}}"),
            ("histogram_quantile(0.5, sum by (le, modality) (rate(swaserve_encoder_preprocess_seconds_bucket[$__rate_interval])))", "preprocessing P50 (s) {{modality}}"),
        ], "short", "Items of concurrent requests per encoder forward (cross-request batching), how long an item waited for its batch, and decode + preprocessing time per item."),
        panel("Encoder: items/s and embedding-cache hit rate", [
            ("sum by (modality) (rate(swaserve_encoder_items_total[$__rate_interval]))", "items/s {{modality}}"),
            ("sum(rate(swaserve_encoder_cache_lookups_total{result=\"hit\"}[$__rate_interval])) / sum(rate(swaserve_encoder_cache_lookups_total[$__rate_interval]))", "cache hit rate"),
            ("sum by (instance) (swaserve_encoder_cache_bytes)", "cache bytes {{instance}}"),
        ], "short", "Images and audio clips encoded per second, the share served from the embedding cache, and its size per encoder."),
    ]),
}


def build(uid, title, panels):
    out = []
    for i, p in enumerate(panels):
        out.append({
            "id": i + 1,
            "type": "timeseries",
            "title": p["title"],
            "description": p["description"],
            "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p["unit"]}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(ord("A") + j), "datasource": DS, "expr": e, "legendFormat": legend}
                        for j, (e, legend) in enumerate(p["exprs"])],
        })
    return {
        "uid": uid,
        "title": title,
        "tags": ["swaserve"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                  "label": "Prometheus"}]},
        "panels": out,
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for uid, (title, panels) in DASHBOARDS.items():
        path = os.path.join(here, "dashboards", uid + ".json")
        with open(path, "w") as f:
            json.dump(build(uid, title, panels), f, indent=2)
            f.write("\n")
        print("wrote", path)


if __name__ == "__main__":
    main()

// Subcommands of the swaserve CLI that live outside main.cc. Each takes argv
// shifted by one (argv[0] = the command name) and returns the exit status.
#pragma once

namespace swaserve::cli {

// swaserve up: a whole cluster on this machine (lib/launch), until SIGINT or
// SIGTERM. Call before anything starts a thread (it blocks the signals).
int Up(int argc, const char* const* argv);

// swaserve generate: one streamed Router.Generate call.
int Generate(int argc, const char* const* argv);

// swaserve chat: a REPL over Router.Generate with the conversation history.
int Chat(int argc, const char* const* argv);

// swaserve dashboard: deploy/grafana's dashboards rendered from a live
// Prometheus to HTML + PNG charts (dashboard.cc).
int Dashboard(int argc, const char* const* argv);

// swaserve kv-events: the prefill workers' KV event streams (kv_events.cc).
int KvEvents(int argc, const char* const* argv);

// swaserve kv-plan: the KV pool each worker needs for its bucket (kv_plan.cc).
int KvPlan(int argc, const char* const* argv);

// swaserve export-gguf: a checkpoint as a GGUF file for llama.cpp's mimo2
// architecture (export_gguf.cc, lib/model/gguf_export.h).
int ExportGguf(int argc, const char* const* argv);

}  // namespace swaserve::cli

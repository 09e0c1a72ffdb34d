#include "lib/loadgen/agent_trace.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "lib/base/hash.h"

namespace swaserve::loadgen {
namespace {

// Seeds scoped block ids; changing it changes every synthetic agent prompt.
constexpr uint64_t kScopeSeed = 0x6167656e74736573ull;  // "agentses"

class LineParser {
 public:
  LineParser(const AgentParseOptions& options, int64_t line,
             std::vector<AgentSession>* out)
      : options_(options), line_(line), out_(out) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(options_.source, ":", line_, ": ", what));
  }

  absl::StatusOr<double> Number(const nlohmann::json& j, const char* key,
                                bool required) const {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) return Error(absl::StrCat("missing field '", key, "'"));
      return 0.0;
    }
    if (it->is_null() && !required) return 0.0;
    if (!it->is_number()) {
      return Error(absl::StrCat("field '", key, "' is not a number"));
    }
    const double d = it->get<double>();
    if (!std::isfinite(d) || d < 0) {
      return Error(absl::StrCat("field '", key, "' is negative or not finite"));
    }
    return d;
  }

  absl::StatusOr<int64_t> Count(const nlohmann::json& j,
                                const char* key) const {
    auto it = j.find(key);
    if (it == j.end()) return Error(absl::StrCat("missing field '", key, "'"));
    if (it->is_number_unsigned() && it->get<uint64_t>() < (uint64_t{1} << 62)) {
      return static_cast<int64_t>(it->get<uint64_t>());
    }
    if (it->is_number_integer() && it->get<int64_t>() >= 0) {
      return it->get<int64_t>();
    }
    return Error(
        absl::StrCat("field '", key, "' is not a non-negative integer"));
  }

  absl::StatusOr<AgentRequest> Request(const nlohmann::json& j,
                                       int block) const {
    AgentRequest r;
    auto t = Number(j, "t", true);
    if (!t.ok()) return t.status();
    auto think = Number(j, "think_time", false);
    if (!think.ok()) return think.status();
    auto api = Number(j, "api_time", false);
    if (!api.ok()) return api.status();
    auto in = Count(j, "in");
    if (!in.ok()) return in.status();
    auto out = Count(j, "out");
    if (!out.ok()) return out.status();
    r.t_s = *t;
    r.think_time_s = *think;
    r.api_time_s = *api;
    r.input_tokens = *in;
    r.output_tokens = *out;
    auto ids = j.find("hash_ids");
    if (ids == j.end()) return Error("missing field 'hash_ids'");
    if (!ids->is_array()) return Error("field 'hash_ids' is not an array");
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_integer()) {
        return Error("field 'hash_ids' holds a non-integer element");
      }
      r.hash_ids.push_back(id.get<int64_t>());
    }
    // The trace names full blocks only; a partial last block has no id.
    const int64_t needed = r.input_tokens / block;
    if (static_cast<int64_t>(r.hash_ids.size()) < needed) {
      return Error(absl::StrCat("prompt of ", r.input_tokens, " tokens has ",
                                r.hash_ids.size(), " hash ids, needs ",
                                needed));
    }
    return r;
  }

  // Appends `j` (a session or sub-agent object) and, depth first, its
  // sub-agents.
  absl::Status Session(const nlohmann::json& j, int64_t scope, int64_t parent,
                       double offset_s, std::string id, int block, int depth) {
    if (depth > options_.max_depth) return Error("sub-agents nested too deep");
    auto reqs = j.find("requests");
    if (reqs == j.end()) return Error("missing field 'requests'");
    if (!reqs->is_array()) return Error("field 'requests' is not an array");
    const int64_t index = static_cast<int64_t>(out_->size());
    out_->push_back(AgentSession{.index = index,
                                 .scope = scope < 0 ? index : scope,
                                 .parent = parent,
                                 .offset_s = offset_s,
                                 .id = std::move(id),
                                 .block_tokens = block});
    const int64_t my_scope = (*out_)[index].scope;
    int subs = 0;
    for (const auto& e : *reqs) {
      if (!e.is_object()) return Error("a request is not a JSON object");
      auto type = e.find("type");
      if (type != e.end() && type->is_string() &&
          type->get<std::string>() == "subagent") {
        auto t = Number(e, "t", true);
        if (!t.ok()) return t.status();
        std::string sub_id = absl::StrCat((*out_)[index].id, "/sub", subs++);
        auto aid = e.find("agent_id");
        if (aid != e.end() && aid->is_string()) {
          sub_id =
              absl::StrCat((*out_)[index].id, "/", aid->get<std::string>());
        }
        if (absl::Status s = Session(e, my_scope, index, offset_s + *t,
                                     std::move(sub_id), block, depth + 1);
            !s.ok()) {
          return s;
        }
        continue;
      }
      auto r = Request(e, block);
      if (!r.ok()) return r.status();
      (*out_)[index].requests.push_back(*std::move(r));
    }
    return absl::OkStatus();
  }

 private:
  const AgentParseOptions& options_;
  const int64_t line_;
  std::vector<AgentSession>* const out_;
};

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

double AgentSession::DurationS() const {
  double end = 0;
  for (const AgentRequest& r : requests) {
    end = std::max(end, r.t_s + r.api_time_s);
  }
  return end;
}

absl::StatusOr<std::vector<AgentSession>> ParseAgentSessions(
    absl::string_view jsonl, const AgentParseOptions& options) {
  std::vector<AgentSession> out;
  int64_t line = 0;
  int64_t top = 0;
  size_t pos = 0;
  while (pos < jsonl.size()) {
    size_t end = jsonl.find('\n', pos);
    if (end == absl::string_view::npos) end = jsonl.size();
    const absl::string_view text = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (text.find_first_not_of(" \t\r") == absl::string_view::npos) continue;
    if (options.limit > 0 && top >= options.limit) break;
    LineParser p(options, line, &out);
    nlohmann::json j =
        nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
    if (j.is_discarded()) return p.Error("not valid JSON");
    if (!j.is_object()) return p.Error("not a JSON object");
    int block = 64;
    if (auto b = j.find("block_size"); b != j.end()) {
      if (!b->is_number_integer() || b->get<int64_t>() < 1 ||
          b->get<int64_t>() > 65536) {
        return p.Error("field 'block_size' is not an integer in [1, 65536]");
      }
      block = static_cast<int>(b->get<int64_t>());
    }
    std::string id = absl::StrCat("session", top);
    if (auto i = j.find("id"); i != j.end() && i->is_string()) {
      id = i->get<std::string>();
    }
    if (absl::Status s = p.Session(j, -1, -1, 0.0, std::move(id), block, 0);
        !s.ok()) {
      return s;
    }
    ++top;
  }
  return out;
}

absl::StatusOr<std::vector<AgentSession>> LoadAgentTrace(
    const std::string& path, const AgentParseOptions& options) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open trace"));
  }
  std::string text;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) text.append(buf, n);
  int err = Z_OK;
  const char* msg = gzerror(f, &err);
  const bool failed = n < 0 || (err != Z_OK && err != Z_STREAM_END);
  const std::string why = failed && msg != nullptr ? msg : "";
  gzclose(f);
  if (failed) {
    return absl::DataLossError(absl::StrCat(path, ": read error: ", why));
  }
  AgentParseOptions o = options;
  o.source = path;
  return ParseAgentSessions(text, o);
}

absl::StatusOr<AgentSchedule> ScheduleAgentSessions(
    const std::vector<AgentSession>& sessions,
    const AgentScheduleOptions& options) {
  const auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
  if (bad(options.concurrency) || bad(options.span_s) ||
      bad(options.time_scale)) {
    return absl::InvalidArgumentError(
        "agent schedule: concurrency, span_s and time_scale must be finite "
        "and >= 0");
  }
  AgentSchedule s;
  std::vector<int64_t> tops;
  double total = 0;
  for (const AgentSession& a : sessions) {
    if (a.top_level()) {
      tops.push_back(a.index);
      total += a.DurationS() * options.time_scale;
    }
  }
  s.span_s =
      options.concurrency > 0 ? total / options.concurrency : options.span_s;
  if (options.seed != 0) {
    uint64_t state = options.seed;
    for (size_t i = tops.size(); i > 1; --i) {
      std::swap(tops[i - 1], tops[SplitMix64(state) % i]);
    }
  }
  s.start_s.assign(sessions.size(), 0);
  const double step = tops.empty() ? 0 : s.span_s / tops.size();
  for (size_t k = 0; k < tops.size(); ++k) s.start_s[tops[k]] = k * step;
  for (const AgentSession& a : sessions) {
    if (!a.top_level()) {
      s.start_s[a.index] = s.start_s[a.scope] + a.offset_s * options.time_scale;
    }
    for (size_t r = 0; r < a.requests.size(); ++r) {
      s.arrivals.push_back(AgentArrival{
          .arrival_s =
              s.start_s[a.index] + a.requests[r].t_s * options.time_scale,
          .session = a.index,
          .request = static_cast<int64_t>(r)});
    }
  }
  std::sort(s.arrivals.begin(), s.arrivals.end(),
            [](const AgentArrival& x, const AgentArrival& y) {
              if (x.arrival_s != y.arrival_s) return x.arrival_s < y.arrival_s;
              if (x.session != y.session) return x.session < y.session;
              return x.request < y.request;
            });
  return s;
}

int64_t ScopedBlockId(int64_t scope, int64_t local_id) {
  const int64_t key[2] = {scope, local_id};
  return static_cast<int64_t>(base::Hash64(key, sizeof(key), kScopeSeed) >> 1);
}

TraceRequest AsTraceRequest(const AgentSession& session, int64_t request) {
  const AgentRequest& a = session.requests[request];
  TraceRequest r;
  r.input_length = a.input_tokens;
  r.output_length = a.output_tokens;
  r.hash_ids.reserve(a.hash_ids.size() + 1);
  for (int64_t id : a.hash_ids) {
    r.hash_ids.push_back(ScopedBlockId(session.scope, id));
  }
  const int64_t block = std::max(1, session.block_tokens);
  if (static_cast<int64_t>(a.hash_ids.size()) * block < a.input_tokens) {
    // The partial last block the trace leaves unnamed: an id of its own.
    const int64_t key[4] = {session.scope,
                            a.hash_ids.empty() ? -1 : a.hash_ids.back(),
                            a.input_tokens, 0x7461696c};  // "tail"
    r.hash_ids.push_back(
        static_cast<int64_t>(base::Hash64(key, sizeof(key), kScopeSeed) >> 1));
  }
  return r;
}

std::vector<uint32_t> AgentPromptSynthesizer::Next(const AgentSession& session,
                                                   int64_t request) {
  std::unique_ptr<PromptSynthesizer>& synth = by_scope_[session.scope];
  if (synth == nullptr) {
    PromptSynthesizer::Options o{
        .scale = options_.scale,
        .vocab_size = options_.vocab_size,
        .first_id = options_.first_id,
        .reconstruct_continuations = options_.reconstruct_continuations};
    o.scale.block_tokens = session.block_tokens;
    synth = std::make_unique<PromptSynthesizer>(o);
  }
  return synth->Next(AsTraceRequest(session, request));
}

}  // namespace swaserve::loadgen

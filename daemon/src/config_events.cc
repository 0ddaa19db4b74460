// The events: section of the configuration (config.h's EventsConfig).
#include <string>

#include "config_section.h"
#include "kvtier/event_stream.h"

namespace kvtier::daemon {
namespace {

Status CheckEndpoint(Section& s, const char* key, const std::string& endpoint) {
  if (endpoint.empty()) return Status::Ok();
  for (const char* scheme : {"tcp://", "ipc://"}) {
    if (endpoint.starts_with(scheme) && endpoint.size() > std::string_view(scheme).size()) return Status::Ok();
  }
  return s.Error(key, "'" + endpoint.substr(0, 80) + "' is not a ZMQ endpoint: tcp://HOST:PORT or ipc:///PATH");
}

}  // namespace

std::string EventsPublishEndpoint(const EventsConfig& e, const std::string& socket_path) {
  return e.publish.empty() ? events::DefaultPublishEndpoint(socket_path) : e.publish;
}

std::string EventsReplayEndpoint(const EventsConfig& e, const std::string& socket_path) {
  return e.replay.empty() ? events::DefaultReplayEndpoint(socket_path) : e.replay;
}

Status ParseEvents(const YAML::Node& node, const std::string& source, EventsConfig* out) {
  if (!node.IsMap()) return InvalidArgument(source + ": events: expected a mapping (enabled, publish, ...)");
  Section s(node, "events", source);
  KVTIER_RETURN_IF_ERROR(s.Known(
      {"enabled", "publish", "replay", "topic", "token_ids", "max_batch_events", "replay_batches", "queue_batches"}));
  KVTIER_RETURN_IF_ERROR(s.ReadBool("enabled", &out->enabled));
  KVTIER_RETURN_IF_ERROR(s.ReadString("publish", &out->publish));
  KVTIER_RETURN_IF_ERROR(CheckEndpoint(s, "publish", out->publish));
  KVTIER_RETURN_IF_ERROR(s.ReadString("replay", &out->replay));
  KVTIER_RETURN_IF_ERROR(CheckEndpoint(s, "replay", out->replay));
  if (!out->publish.empty() && out->publish == out->replay) {
    return s.Error("replay", "must differ from events.publish");
  }
  KVTIER_RETURN_IF_ERROR(s.ReadString("topic", &out->topic));
  if (out->topic.size() > 255) return s.Error("topic", "must be at most 255 bytes");
  KVTIER_RETURN_IF_ERROR(s.ReadBool("token_ids", &out->token_ids));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("max_batch_events", &out->max_batch_events, 1, 1u << 20));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("replay_batches", &out->replay_batches, 0, 1u << 24));
  KVTIER_RETURN_IF_ERROR(s.Read<uint32_t>("queue_batches", &out->queue_batches, 1, 1u << 20));
  return s.CheckUnknown();
}

}  // namespace kvtier::daemon

// The multimodal markers of the public API: where a prompt's text
// (GenerateRequest.text or a ChatMessage's content) places the k-th item of
// GenerateRequest.multimodal. They are Qwen-VL's and Qwen-Omni's pad tokens,
// so a prompt written for those models reads the same here. The OpenAI HTTP
// API writes one marker per image_url / input_audio / video_url content part;
// the router cuts the rendered prompt at each marker
// (model::EncodeTextWithMarkers, ChatTemplate::EncodeWithMarkers) and puts
// the item's placeholder tokens there, as many as its embedding has rows. A
// request without items is never cut: there the marker text is ordinary text.
#pragma once

#include <string_view>

namespace swaserve::base {

inline constexpr std::string_view kImageMarker = "<|image_pad|>";
inline constexpr std::string_view kVideoMarker = "<|video_pad|>";
inline constexpr std::string_view kAudioMarker = "<|audio_pad|>";

}  // namespace swaserve::base

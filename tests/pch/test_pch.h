// Precompiled header of every test file (swaserve_test, SWASERVE_TEST_PCH):
// the standard, GoogleTest, Abseil, gRPC/Protobuf and JSON headers that test
// files parse over and over. Parsing them was about half of a test file's
// compile time (clang -ftime-trace on router_legs_test.cc: 8.2 s, 3.9 s with
// this header precompiled), and test files are half of CI's compile time.
//
// Only third-party headers: a project header here would rebuild every test
// when it changes. Nothing here may depend on a macro that some test target
// defines and another does not (the PCH is built once per flag set and
// reused by every test, cmake/SwaserveHelpers.cmake).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

# Helpers that give every project target the same warnings, sanitizers and
# include path. Third-party code never gets these flags.
#
#   swaserve_library(NAME SRCS a.cc ... [DEPS dep ...] [PRIVATE_DEPS dep ...])
#       static library swaserve_NAME (alias swaserve::NAME), includes from the
#       repository root: #include "lib/base/status.h".
#   swaserve_executable(NAME SRCS ... [DEPS ...])
#   swaserve_test(NAME SRCS ... LABELS module kind [DEPS ...] [PROPERTIES k v ...])
#       GoogleTest binary registered with gtest_discover_tests; every test case
#       gets LABELS (docs/architecture.md#conventions: module + unit|integration|e2e). With
#       SWASERVE_TEST_PCH its sources get tests/pch/test_pch.h precompiled.
#       With SWASERVE_TEST_PER_CASE=OFF a unit-test binary is one ctest entry.

set(SWASERVE_WARNINGS -Wall -Wextra -Wpedantic -Wno-unused-parameter
    -Wno-missing-field-initializers)
if(SWASERVE_WERROR)
  list(APPEND SWASERVE_WARNINGS -Werror)
endif()

set(SWASERVE_SANITIZE_FLAGS "")
if(SWASERVE_SANITIZE)
  set(SWASERVE_SANITIZE_FLAGS -fsanitize=${SWASERVE_SANITIZE} -fno-omit-frame-pointer
      -fno-sanitize-recover=all)
endif()
set(SWASERVE_FUZZ_COVERAGE_FLAGS "")
if(SWASERVE_FUZZ)
  # Every target gets the fuzz targets' sanitizers; coverage instrumentation
  # (what libFuzzer steers by) only the libraries whose parsers a fuzz target
  # drives (tests/fuzz): in the others and in the tests it was a fifth of
  # their compile time in the sanitizer build and told libFuzzer nothing.
  list(APPEND SWASERVE_SANITIZE_FLAGS -fsanitize=address,undefined)
  set(SWASERVE_FUZZ_COVERAGE_FLAGS -fsanitize=fuzzer-no-link)
endif()
if(SWASERVE_NO_SANITIZE AND SWASERVE_SANITIZE_FLAGS)
  # Last, so the -fsanitize groups above do not turn them back on. CI leaves
  # out UBSan's vptr (dynamic-type checks on every polymorphic member access
  # and cast): ~12% of a sanitizer-build file's compile time.
  list(APPEND SWASERVE_SANITIZE_FLAGS -fno-sanitize=${SWASERVE_NO_SANITIZE})
endif()
# Keep in step with tests/fuzz/CMakeLists.txt (what each target links).
set(SWASERVE_FUZZED_LIBRARIES base model model_text grammar api kv media cluster)

function(swaserve_setup_target target)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:${SWASERVE_WARNINGS} ${SWASERVE_SANITIZE_FLAGS}>)
  if(SWASERVE_SANITIZE_FLAGS)
    # Links as before: any executable may hold instrumented libraries.
    target_link_options(${target} PUBLIC ${SWASERVE_SANITIZE_FLAGS}
                        ${SWASERVE_FUZZ_COVERAGE_FLAGS})
  endif()
endfunction()

function(swaserve_library name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(swaserve_${name} STATIC ${A_SRCS})
  add_library(swaserve::${name} ALIAS swaserve_${name})
  swaserve_setup_target(swaserve_${name})
  if(SWASERVE_FUZZ_COVERAGE_FLAGS AND name IN_LIST SWASERVE_FUZZED_LIBRARIES)
    target_compile_options(swaserve_${name} PRIVATE
        $<$<COMPILE_LANGUAGE:CXX>:${SWASERVE_FUZZ_COVERAGE_FLAGS}>)
  endif()
  target_link_libraries(swaserve_${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
endfunction()

function(swaserve_executable name)
  cmake_parse_arguments(A "" "OUTPUT_NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  swaserve_setup_target(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
  if(A_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${A_OUTPUT_NAME})
  endif()
endfunction()

# The precompiled header of test files (tests/pch/test_pch.h), built once per
# flag set by an object library and reused by every test with those flags:
# `variant` is "opt" (the build type's flags) or "o0" (plus
# SWASERVE_TEST_COMPILE_OPTIONS). The object library gets exactly the flags a
# test gets (swaserve_setup_target, GoogleTest's definitions) and links nothing
# else, so a test's extra definitions (spdlog's, SWASERVE_*_BIN paths) come on
# top of the PCH's, which clang accepts. Returns the target's name in `out`.
function(swaserve_test_pch variant out)
  set(pch swaserve_test_pch_${variant})
  if(NOT TARGET ${pch})
    add_library(${pch} OBJECT ${PROJECT_SOURCE_DIR}/tests/pch/test_pch.cc)
    swaserve_setup_target(${pch})
    if(variant STREQUAL "o0")
      target_compile_options(${pch} PRIVATE ${SWASERVE_TEST_COMPILE_OPTIONS})
    endif()
    target_link_libraries(${pch} PRIVATE GTest::gtest GTest::gmock)
    # Half the tests get -pthread from Threads::Threads (through gRPC) and
    # half do not; clang refuses a PCH whose -pthread differs, so every test
    # and the PCH compile with it (it only defines _REENTRANT).
    target_compile_options(${pch} PRIVATE -pthread)
    target_precompile_headers(${pch} PRIVATE ${PROJECT_SOURCE_DIR}/tests/pch/test_pch.h)
  endif()
  set(${out} ${pch} PARENT_SCOPE)
endfunction()

function(swaserve_test name)
  cmake_parse_arguments(A "" "TIMEOUT" "SRCS;DEPS;LABELS;PROPERTIES" ${ARGN})
  if(NOT A_LABELS)
    message(FATAL_ERROR "swaserve_test(${name}): LABELS (module and kind) are required")
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 120)
  endif()
  add_executable(${name} ${A_SRCS})
  swaserve_setup_target(${name})
  # Tests declared long-running (a TIMEOUT above the default: randomized and
  # model tests whose hot loops are in the test file) keep the build type's
  # optimisation: at -O0 under ASan the kv property test ran 111 s instead of 17.
  set(pch_variant opt)
  if(SWASERVE_TEST_COMPILE_OPTIONS AND A_TIMEOUT LESS_EQUAL 120)
    target_compile_options(${name} PRIVATE ${SWASERVE_TEST_COMPILE_OPTIONS})
    set(pch_variant o0)
  endif()
  if(SWASERVE_TEST_PCH)
    swaserve_test_pch(${pch_variant} pch)
    target_precompile_headers(${name} REUSE_FROM ${pch})
    target_compile_options(${name} PRIVATE -pthread)
  endif()
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(NOT SWASERVE_TEST_PER_CASE AND "unit" IN_LIST A_LABELS)
    # One ctest entry per unit-test binary (CI's builds): each case was its
    # own process, and per-process set-up (a tokenizer's JSON parsed under
    # ASan: ~4 s) was most of a case's time. A failing case is named in the
    # binary's output (--output-on-failure). Integration and end-to-end
    # cases stay one entry each (each starts its own processes, RUN_SERIAL).
    math(EXPR whole_timeout "${A_TIMEOUT} * 5")
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT ${whole_timeout} LABELS "${A_LABELS}"
                         ${A_PROPERTIES})
    return()
  endif()
  gtest_discover_tests(${name}
      DISCOVERY_TIMEOUT 60
      PROPERTIES TIMEOUT ${A_TIMEOUT} ${A_PROPERTIES})
  # gtest_discover_tests flattens a list-valued property ("metrics;unit" would
  # become LABELS metrics + a bogus property "unit"), so set LABELS from a file
  # that ctest includes after the discovered tests (${name}_TESTS) exist.
  set(labels_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake)
  file(WRITE ${labels_file}
       "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${A_LABELS}\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_file})
endfunction()

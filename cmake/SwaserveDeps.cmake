# Finds every third-party dependency the standard way on Debian 12.
# scripts/install-deps.sh installs all of them.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(Protobuf REQUIRED)          # module mode: Debian ships no protobuf-config
find_package(gRPC CONFIG REQUIRED)       # gRPC::grpc++, gRPC::grpc_cpp_plugin
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(spdlog REQUIRED)
find_package(yaml-cpp REQUIRED)
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(LIBEVENT REQUIRED IMPORTED_TARGET libevent_core libevent_extra libevent_pthreads)  # router HTTP API
pkg_check_modules(LIBEVENT_OPENSSL REQUIRED IMPORTED_TARGET libevent_openssl)  # its TLS
find_package(OpenSSL REQUIRED)           # OpenSSL::SSL, OpenSSL::Crypto: lib/rpc/tls.h
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(PNG REQUIRED IMPORTED_TARGET libpng)  # dashboard charts, lib/media
pkg_check_modules(JPEG REQUIRED IMPORTED_TARGET libjpeg)  # lib/media (libjpeg-turbo)
pkg_check_modules(FFMPEG REQUIRED IMPORTED_TARGET  # lib/media: video, resampling
                  libavformat libavcodec libavutil libswscale libswresample)

# CUDA: AUTO turns on when nvcc is found (on PATH, CUDACXX or /usr/local/cuda).
set(SWASERVE_HAVE_CUDA OFF)
if(NOT SWASERVE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(SWASERVE_NVCC nvcc HINTS /usr/local/cuda/bin)
    if(SWASERVE_NVCC)
      set(CMAKE_CUDA_COMPILER ${SWASERVE_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)   # H100/H200; override with -DCMAKE_CUDA_ARCHITECTURES
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(SWASERVE_HAVE_CUDA ON)
  elseif(SWASERVE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SWASERVE_CUDA=ON but nvcc was not found")
  endif()
endif()
message(STATUS "swaserve: CUDA ${SWASERVE_HAVE_CUDA}; sanitizers '${SWASERVE_SANITIZE}'")

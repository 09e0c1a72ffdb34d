// Whether this translation unit is built with AddressSanitizer, for GCC
// (__SANITIZE_ADDRESS__) and clang (__has_feature(address_sanitizer)) alike:
// SWASERVE_ASAN is 1 under ASan, else 0. Tests use it to skip what ASan owns
// (operator new/delete replacements) or to shrink what ASan slows down.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define SWASERVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SWASERVE_ASAN 1
#endif
#endif
#ifndef SWASERVE_ASAN
#define SWASERVE_ASAN 0
#endif

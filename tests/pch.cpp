// The program whose precompiled header (GoogleTest and tests/test_util.h) every test program reuses
// (tests/CMakeLists.txt); it has no tests of its own.

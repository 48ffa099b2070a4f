# One helper per kind of target: frugal_target_flags, frugal_add_test, frugal_add_bench, frugal_add_example.

# Warnings, vector extensions and sanitizers for every frugal target.
function(frugal_target_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror=return-type>)
  # clang reports each `#pragma omp simd` loop it did not vectorise (always so under the sanitizers, and for
  # the 16-bit float loops): a remark about a hint, not a defect in the code.
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-pass-failed>)
  endif()
  if(NOT FRUGAL_PORTABLE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
  if(FRUGAL_SANITIZE)
    # -fno-sanitize-recover: a finding stops the program, so that a test (or a fuzzer) fails on it. -O1, the
    # level the sanitizers' documentation suggests, after the build type's -O3 (the last -O wins): the
    # sanitizers find the same faults, and the build takes half the time (kernels/cpu/elementwise.cpp:
    # 178 s at -O3 under ASan, 69 s at -O1).
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${FRUGAL_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer -O1>)
    target_link_options(${target} PRIVATE -fsanitize=${FRUGAL_SANITIZE})
  endif()
endfunction()

# The flags of every test program, the same for all so that they share one precompiled header
# (tests/CMakeLists.txt). A test's own code is checks and naive references: it compiles at -O1 (after the
# build type's -O3: the last -O wins), which takes 60% of -O3's time, while the library it tests keeps the
# build type's level (those FRUGAL_TESTS_AT_BUILD_LEVEL names excepted).
function(frugal_test_flags target)
  target_link_libraries(${target} PRIVATE frugal GTest::gtest GTest::gtest_main nlohmann_json::nlohmann_json)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  # Reference data produced by scripts such as tests/fixtures/gen_optim.py, read with nlohmann/json.
  target_compile_definitions(${target} PRIVATE FRUGAL_FIXTURES_DIR="${PROJECT_SOURCE_DIR}/tests/fixtures")
  # The checks of what a build with oneDNN registers (#ifdef FRUGAL_HAVE_ONEDNN in the tests) run in it.
  if(FRUGAL_HAVE_ONEDNN)
    target_compile_definitions(${target} PRIVATE FRUGAL_HAVE_ONEDNN=1)
  endif()
  frugal_target_flags(${target})
  if(NOT target IN_LIST FRUGAL_TESTS_AT_BUILD_LEVEL)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O1>)
  endif()
endfunction()

# frugal_add_test(name SOURCES a.cpp b.cpp [LABELS ...] [PROPERTIES ...]): a GoogleTest executable registered
# with ctest, each case a test with those labels and properties.
function(frugal_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LABELS;PROPERTIES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  frugal_test_flags(${name})
  # A header precompiled at -O1 brings -O1 with it (gcc restores the optimisation options saved in it).
  if(TARGET frugal_tests_pch AND NOT name IN_LIST FRUGAL_TESTS_AT_BUILD_LEVEL)
    target_precompile_headers(${name} REUSE_FROM frugal_tests_pch)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${ARG_LABELS}" ${ARG_PROPERTIES})
endfunction()

# frugal_add_bench(name SOURCES ...): a Google Benchmark program (not run by ctest).
function(frugal_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE frugal benchmark::benchmark ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  frugal_target_flags(${name})
endfunction()

# frugal_add_example(name SOURCES ...): a program a user runs; sees only the public headers.
function(frugal_add_example name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE frugal)
  if(TARGET CLI11::CLI11)
    target_link_libraries(${name} PRIVATE CLI11::CLI11)
  endif()
  frugal_target_flags(${name})
endfunction()

# Finds frugal's dependencies (all Debian packages; scripts/setup.sh installs them) and decides the optional parts.
include(GNUInstallDirs)

# A folder of header-only and source dependencies packed by scripts/pack-gpu-deps.sh, for a machine with no
# Debian packages (scripts/gpu-check.sh): searched before the system. zlib's headers come from it, its library
# is the machine's own runtime one (libz.so.1, without the development package's libz.so link).
set(FRUGAL_DEPS_DIR "" CACHE PATH "Packed dependencies (scripts/pack-gpu-deps.sh), searched before the system")
if(FRUGAL_DEPS_DIR)
  list(PREPEND CMAKE_PREFIX_PATH ${FRUGAL_DEPS_DIR})
  if(NOT ZLIB_LIBRARY)
    find_library(ZLIB_LIBRARY NAMES z libz.so.1)
  endif()
  message(STATUS "frugal: dependencies from ${FRUGAL_DEPS_DIR} first")
endif()
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(ZLIB REQUIRED)                  # gzip'd IDX data files
find_package(nlohmann_json 3 REQUIRED)       # safetensors headers
find_package(CLI11 QUIET)                    # the examples' command lines

# Random123 (Philox counter-based RNG) is header-only and ships no CMake config.
find_path(RANDOM123_INCLUDE_DIR Random123/philox.h REQUIRED)
add_library(Random123::Random123 INTERFACE IMPORTED)
target_include_directories(Random123::Random123 INTERFACE ${RANDOM123_INCLUDE_DIR})

set(FRUGAL_HAVE_ONEDNN OFF)
if(NOT FRUGAL_ONEDNN STREQUAL "OFF")
  find_package(dnnl QUIET)
  if(dnnl_FOUND)
    set(FRUGAL_HAVE_ONEDNN ON)
  elseif(FRUGAL_ONEDNN STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_ONEDNN=ON but oneDNN was not found (apt-get install libdnnl-dev)")
  endif()
endif()

# MPI (Debian's OpenMPI) for dist/: several processes training one model under mpirun. Without it a run is
# one process, and dist's collectives are copies.
set(FRUGAL_MPI AUTO CACHE STRING "Distributed training over MPI: AUTO (when found), ON (required), OFF")
set_property(CACHE FRUGAL_MPI PROPERTY STRINGS AUTO ON OFF)
set(FRUGAL_HAVE_MPI OFF)
if(NOT FRUGAL_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS C)
  if(MPI_C_FOUND)
    set(FRUGAL_HAVE_MPI ON)
    message(STATUS "frugal: MPI ${MPI_C_VERSION} (dist: mpirun ${MPIEXEC_EXECUTABLE})")
  elseif(FRUGAL_MPI STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_MPI=ON but MPI was not found (apt-get install libopenmpi-dev openmpi-bin)")
  endif()
endif()

set(FRUGAL_HAVE_CUDA OFF)
if(NOT FRUGAL_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # H100/H200 (sm_90) code and PTX by default: other GPUs compile the PTX when the library loads, and one
    # architecture keeps the build within CI's time; -DCMAKE_CUDA_ARCHITECTURES=native builds for the GPU
    # present.
    set(CMAKE_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures to build for")
    if(NOT CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})  # one C++ compiler (and ABI) for .cpp and .cu
    endif()
    enable_language(CUDA)
    # Debian 12's CMake (3.25) knows nvcc's -std flags only up to C++17; nvcc >= 12 compiles C++20, which the
    # core headers are.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    set(FRUGAL_HAVE_CUDA ON)
  elseif(FRUGAL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()

# cuDNN: in the CUDA toolkit, or where CUDNN_ROOT points (a Python wheel's nvidia/cudnn folder has include/
# and lib/ with only versioned names such as libcudnn.so.9). The CUDA convolution runs through it when found
# (kernels/cuda/conv_cudnn.cu; im2col + GEMM otherwise); the GPU check program reports the version it loads.
set(FRUGAL_CUDNN AUTO CACHE STRING "cuDNN: AUTO (when found), ON (required), OFF")
set_property(CACHE FRUGAL_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(FRUGAL_HAVE_CUDNN OFF)
if(FRUGAL_HAVE_CUDA AND NOT FRUGAL_CUDNN STREQUAL "OFF")
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 libcudnn.so.8 NAMES_PER_DIR
    HINTS ${CUDNN_ROOT}/lib ${CUDNN_ROOT}/lib64 ${CUDAToolkit_LIBRARY_DIR})
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY)
    add_library(frugal_cudnn INTERFACE IMPORTED)
    target_include_directories(frugal_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
    target_link_libraries(frugal_cudnn INTERFACE ${CUDNN_LIBRARY})
    set(FRUGAL_HAVE_CUDNN ON)
    message(STATUS "frugal: cuDNN ${CUDNN_LIBRARY}")
  elseif(FRUGAL_CUDNN STREQUAL "ON")
    message(FATAL_ERROR "FRUGAL_CUDNN=ON but cuDNN was not found; point CUDNN_ROOT at its folder")
  endif()
endif()

if(FRUGAL_HAVE_ONEDNN)
  message(STATUS "frugal: CPU GEMM through oneDNN")
else()
  message(STATUS "frugal: CPU GEMM through Eigen")
endif()
message(STATUS "frugal: CUDA backend ${FRUGAL_HAVE_CUDA}")

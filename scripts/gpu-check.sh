#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, CUDA, CMake, ninja and a C++ compiler (no Debian packages,
# no network needed), builds frugal's CUDA backend against the dependencies packed beforehand by
# scripts/pack-gpu-deps.sh, runs the GPU tests, and times bf16 GEMM 8192^3 beside cuBLAS, an int8
# QuantizedLinear beside its f32 Linear, a 1 GiB device-to-device copy, elementwise bandwidth and the W3 GPT
# training step on the GPU in f32 and under bf16 autocast (bench/cuda/gpu_bench.cu), printing a short table.
# Aims to finish within 8 minutes. Environment: FRUGAL_DEPS_DIR (default .gpu-deps), FRUGAL_BUILD_DIR (default
# build-gpu), FRUGAL_JOBS (default: the number of cores), CUDNN_ROOT (a cuDNN folder; found by itself in the
# CUDA toolkit or a Python wheel's nvidia/cudnn otherwise), GPU_CHECK_CMAKE_ARGS (more -D options). Set
# GPU_CHECK_CONFIGURE_ONLY=1 to stop after configuring (a dry run, possible without a GPU), and
# GPU_CHECK_PREFER_WHEEL_CUDNN=1 to look for a Python wheel's cuDNN even where the toolkit has one.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
deps="${FRUGAL_DEPS_DIR:-$root/.gpu-deps}"
build="${FRUGAL_BUILD_DIR:-build-gpu}"
jobs="${FRUGAL_JOBS:-$(nproc)}"
start=$SECONDS
phase() { echo "== gpu-check [$((SECONDS - start)) s] $*"; }

# --- Tools -----------------------------------------------------------------------------------------------------
nvcc="${CUDACXX:-}"
if [[ -z "$nvcc" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$nvcc" ]]; then nvcc="$(command -v nvcc || true)"; fi
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || { echo "gpu-check: $tool is not installed" >&2; exit 1; }
done
[[ -n "$nvcc" ]] || { echo "gpu-check: no nvcc (CUDA toolkit) found; set CUDACXX" >&2; exit 1; }
[[ -f "$deps/MANIFEST" ]] || {
  echo "gpu-check: $deps is missing: run scripts/pack-gpu-deps.sh where the Debian packages are installed" \
    "and bring the folder along" >&2
  exit 1
}
cuda_root="$(cd "$(dirname "$nvcc")/.." && pwd)"
phase "tools: $("$nvcc" --version | tail -n 2 | head -n 1), $(cmake --version | head -n 1), ninja $(ninja --version)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi

# --- cuDNN: the toolkit, CUDNN_ROOT, or a Python wheel ---------------------------------------------------------
cudnn_root="${CUDNN_ROOT:-}"
if [[ -z "$cudnn_root" ]] && { [[ "${GPU_CHECK_PREFER_WHEEL_CUDNN:-0}" == 1 ]] || ! ls "$cuda_root"/lib*/libcudnn.so* >/dev/null 2>&1; }; then
  candidates=()
  for py in python3 python; do
    if command -v "$py" >/dev/null; then
      dir="$("$py" -c 'import nvidia.cudnn as m, os; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null || true)"
      if [[ -n "$dir" ]]; then candidates+=("$dir"); fi
    fi
  done
  candidates+=(/usr/local/lib/python3*/dist-packages/nvidia/cudnn /usr/lib/python3/dist-packages/nvidia/cudnn
    "$HOME"/.local/lib/python3*/site-packages/nvidia/cudnn /opt/conda/lib/python3*/site-packages/nvidia/cudnn)
  for dir in "${candidates[@]}"; do
    if [[ -f "$dir/include/cudnn.h" ]] && ls "$dir"/lib/libcudnn.so* >/dev/null 2>&1; then
      cudnn_root="$dir"
      break
    fi
  done
fi
if [[ -n "$cudnn_root" ]]; then
  phase "cuDNN: from $cudnn_root"
  export LD_LIBRARY_PATH="$cudnn_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"  # its sub-libraries load by name
elif ls "$cuda_root"/lib*/libcudnn.so* >/dev/null 2>&1; then
  phase "cuDNN: in the CUDA toolkit ($cuda_root)"
else
  phase "cuDNN: not found (frugal's kernels do not need it yet)"
fi

# --- zlib: the machine's runtime library (the packed folder has the headers) -----------------------------------
zlib="$( (ldconfig -p 2>/dev/null || true) | awk '/libz\.so\.1 / && !found {print $NF; found = 1}')"
for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /lib /usr/lib; do
  if [[ -z "$zlib" && -e "$dir/libz.so.1" ]]; then zlib="$dir/libz.so.1"; fi
done
[[ -n "$zlib" ]] || { echo "gpu-check: no libz.so.1 on this machine" >&2; exit 1; }

# --- Configure and build ---------------------------------------------------------------------------------------
phase "configuring $build against $deps"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DFRUGAL_CUDA=ON -DFRUGAL_DEPS_DIR="$deps" -DFRUGAL_ONEDNN=OFF \
  -DZLIB_LIBRARY="$zlib" \
  ${cudnn_root:+-DCUDNN_ROOT="$cudnn_root"} \
  -DFRUGAL_BUILD_TESTS=ON -DFRUGAL_BUILD_BENCH=OFF -DFRUGAL_BUILD_EXAMPLES=OFF -DFRUGAL_BUILD_GPU_BENCH=ON \
  ${GPU_CHECK_CMAKE_ARGS:-} >"$build.configure.log" 2>&1 || { cat "$build.configure.log" >&2; exit 1; }
grep '^-- frugal:' "$build.configure.log" | sed 's/^-- /   /'
if [[ "${GPU_CHECK_CONFIGURE_ONLY:-0}" == 1 ]]; then
  phase "configured (GPU_CHECK_CONFIGURE_ONLY=1: stopping here)"
  exit 0
fi

# Only what the check runs: the library and its CUDA backend, the GPU test programs and the timing program.
mapfile -t targets < <(cd tests/cuda && ls test_*.cpp | sed 's/^test_/test_cuda_/; s/\.cpp$//')
phase "building ${targets[*]} gpu_bench with $jobs jobs"
cmake --build "$build" -j "$jobs" --target frugal frugal_cuda "${targets[@]}" gpu_bench

# --- Tests -----------------------------------------------------------------------------------------------------
phase "running the GPU tests"
test_status=0
ctest --test-dir "$build" -L cuda -E _on_fake_gpu -j 4 --output-on-failure --timeout 300 || test_status=$?

# --- Measurements ----------------------------------------------------------------------------------------------
phase "timing (CUDA events, medians)"
bench_status=0
"$build/bench/cuda/gpu_bench" || bench_status=$?

phase "done: tests $([[ $test_status == 0 ]] && echo passed || echo FAILED), measurements $(
  [[ $bench_status == 0 ]] && echo checked || echo FAILED)"
exit $((test_status != 0 || bench_status != 0))

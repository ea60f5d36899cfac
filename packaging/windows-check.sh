#!/usr/bin/env bash
# The patched llama.cpp's kernels checked as a Windows build: ggml (CPU backend) and packaging/small-batch-check.c
# cross-compiled with MinGW-w64 and run under Wine. small-batch-check compares every k-token matmul with the same
# tokens' 1-token matmuls, bit for bit, so this is the engine's contract on a Windows binary built by GCC.
# It does not cover MSVC, the compiler of packaging/build-windows.ps1 (docs/BUILDING.md says what that leaves).
#
#   packaging/windows-check.sh [WORKDIR]      WORKDIR defaults to build/windows-check
#
# Needs cmake, Wine and MinGW-w64 with POSIX threads (Debian: apt-get install mingw-w64 wine), and the dev venv
# (.venv, or PYTHON=...) for packaging/llama_source.py. VARIANT=avx512 builds the AVX-512 VNNI variant instead
# of the AVX2+FMA one (it runs only on a CPU that has those instructions); JOBS sets the build's parallelism.
# A build takes a while: this is run by hand, not by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=$(mkdir -p "${1:-build/windows-check}" && cd "${1:-build/windows-check}" && pwd)
PYTHON=${PYTHON:-.venv/bin/python}
VARIANT=${VARIANT:-avx2}
JOBS=${JOBS:-2}
TARGET=x86_64-w64-mingw32
MINGW_GCC_LIB=$(dirname "$("$TARGET-gcc-posix" -print-libgcc-file-name)")

case "$VARIANT" in
    avx2)   CPU_FLAGS=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
            CPU_NEEDS="avx2 fma f16c"
            # the types this build names in BATCH_KERNELS (tests/packaging/test_small_batch_kernels.py, AVX2)
            TYPES=q4_1,q4_K,q6_K,q8_0,q5_0,q4_0,iq4_nl,q5_1 ;;
    avx512) CPU_FLAGS=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                       -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)
            CPU_NEEDS="avx512f avx512bw avx512dq avx512vl avx512_vnni"
            TYPES=q4_1,q4_K,q6_K,q8_0,q5_0,q5_K,q4_0,iq4_nl,q5_1 ;;
    *)      echo "VARIANT must be avx2 or avx512" >&2; exit 2 ;;
esac

SRC=$("$PYTHON" packaging/llama_source.py "$WORK/src")/vendor/llama.cpp
BUILD="$WORK/build-$("$PYTHON" packaging/llama_source.py --key)-$VARIANT"  # other patches, another build
LOG="$BUILD.log"
failed_build() { tail -n 30 "$LOG" >&2; echo "windows-check.sh: the build failed (all of it: $LOG)" >&2; exit 2; }

# ggml, ggml-base and ggml-cpu as DLLs, as a Windows build ships them. Every symbol is exported so that the
# check's --gemv finds llama.cpp's own gemv, which ggml-cpu does not export. Windows 7's API level: from Windows 8
# on, ggml asks that its threads not be power-throttled, with a type older MinGW-w64 headers (Debian 12's) lack;
# that hint schedules threads and changes no arithmetic.
WINVER=-D_WIN32_WINNT=0x0601
RUNTIME=libgcc.a:libgcc_eh.a:libstdc++.a  # linked into each DLL, exported by none
cmake -S "$SRC" -B "$BUILD" -DCMAKE_SYSTEM_NAME=Windows -DCMAKE_SYSTEM_PROCESSOR=x86_64 \
    -DCMAKE_C_COMPILER="$TARGET-gcc-posix" -DCMAKE_CXX_COMPILER="$TARGET-g++-posix" -DCMAKE_RC_COMPILER="$TARGET-windres" \
    -DCMAKE_C_FLAGS="$WINVER" -DCMAKE_CXX_FLAGS="$WINVER" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF "${CPU_FLAGS[@]}" \
    -DCMAKE_SHARED_LINKER_FLAGS="-static-libgcc -static-libstdc++ -Wl,--export-all-symbols,--exclude-libs=$RUNTIME" \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >"$LOG" 2>&1 || failed_build
cmake --build "$BUILD" --target ggml -j "$JOBS" >>"$LOG" 2>&1 || failed_build

EXE="$BUILD/bin/small-batch-check.exe"
"$TARGET-gcc-posix" -O2 -std=gnu11 packaging/small-batch-check.c -I"$SRC/ggml/include" -L"$BUILD/bin" -L"$BUILD/lib" \
    -lggml -lggml-base -lggml-cpu -lpsapi -static-libgcc -o "$EXE"

for flag in $CPU_NEEDS; do
    if ! grep -qw "$flag" /proc/cpuinfo; then
        echo "built $EXE; not run: this CPU lacks $flag"
        exit 0
    fi
done

# a Wine prefix of its own; OpenMP's and pthreads' DLLs from MinGW; no Mono or Gecko prompts
export WINEPREFIX="$WORK/wineprefix" WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml="
export WINEPATH="$MINGW_GCC_LIB;/usr/$TARGET/lib"
check() { wine "$EXE" "$@" | tr -d '\r'; }

failed=0
echo "== every type the build names: k-token columns against 1-token columns (k = 1..32, 48 .. 232; 1 and 2 threads)"
check --types "$TYPES" --shapes 8 || failed=1
echo "== 1 token against ggml's vec_dot, where the tiles keep vec_dot's arithmetic"
check --types q4_1,q6_K,q8_0,q5_0,q5_1 --shapes 4 --vec-dot || failed=1
echo "== 1 token against llama.cpp's gemv, where it repacks the weights"
check --types q4_0,iq4_nl --shapes 6 --gemv || failed=1
echo "== the check itself: Q3_K keeps llama.cpp's kernels, whose batches from 8 tokens differ (expected to differ)"
if check --types q3_K --shapes 4 --threads 1; then
    echo "Q3_K batches were all equal: the check did not see the difference it should" >&2
    failed=1
fi
exit $failed

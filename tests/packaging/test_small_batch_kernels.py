"""The kernels our llama.cpp patches add or change (packaging/llama-cpp-patches/) keep the engine's contract
on the build in use: a matmul over k tokens gives each token the result of a 1-token matmul, bit for bit, for every k
a step can have; and a Q4_K_M model, loaded as the app loads it (weights repacked where llama.cpp repacks them),
has batches exact at every size the engine probes."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from engine import Engine
from engine.costs.exactness import EXACT_PROBE_SIZES, probe_exact_batch
from engine.llama import backend
from engine.llama.kernels import EVERY_SIZE, batch_kernels, explain_exact_limit, matrix_kernels
from engine.tools.shapes import SHAPES, build_shape

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"
CHECK_SOURCE = PACKAGING / "small-batch-check.c"
LIB_DIR = Path(llama_cpp.__file__).resolve().parent / "lib"

x86_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                              reason="the patch changes x86 kernels only")


def _ggml_headers() -> Path:
    """The public ggml headers of the llama.cpp the venv was built from (packaging/llama_source.py's folder)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lookahead-chat" / "src"
    out = subprocess.run([sys.executable, str(PACKAGING / "llama_source.py"), str(cache)],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "vendor" / "llama.cpp" / "ggml" / "include"


@pytest.fixture(scope="module")
def small_batch_check(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler: packaging/system-deps.sh installs one (llama-cpp-python needs it too)")
    exe = tmp_path_factory.mktemp("kernels") / "small-batch-check"
    subprocess.run([cc, "-O2", "-std=gnu11", str(CHECK_SOURCE), f"-I{_ggml_headers()}", f"-L{LIB_DIR}",
                    "-lggml", "-lggml-base", "-lggml-cpu", "-lm", "-ldl", f"-Wl,-rpath,{LIB_DIR}", "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def _run_check(exe: Path, *args: str) -> tuple[int, dict[str, str]]:
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    assert run.stderr == "", run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if line.strip()}
    return run.returncode, lines


@x86_only
def test_every_kernel_the_build_names_gives_batch_tokens_their_1_token_results(small_batch_check):
    # What the build says of itself (BATCH_KERNELS, which engine tune and the model info show), checked:
    # Q4_1: the bundled model; Q4_K and Q6_K: a Q4_K_M file; Q8_0 and Q5_0: a small model's Q4_K_M file (its
    # fallbacks and output matrix); Q4_0 and IQ4_NL: repacked by llama.cpp; Q5_1: a small model's Q5_K_M file.
    # k = 1..32, 48, 63, 64, 96, 128, 232; 1 and 2 threads.
    named = batch_kernels(backend.system_features())
    # an x86 build with AVX2 and FMA
    assert {"Q4_1", "Q4_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "IQ4_NL", "Q5_1"} <= set(named), named
    types = sorted(t[:-2].lower() + t[-2:] if t.endswith("_K") else t.lower() for t in named)
    code, lines = _run_check(small_batch_check, "--types", ",".join(types), "--shapes", "8")
    assert set(lines) == set(types), lines
    for line in lines.values():
        assert " 0 differ" in line and "8 shapes" in line, line
    assert code == 0


@x86_only
def test_a_token_alone_gets_the_unpatched_vec_dot_result_where_the_patch_keeps_its_arithmetic(small_batch_check):
    # The tiles for these types do ggml's vec_dot float operations in vec_dot's order (Q4_K's follow the repacked
    # gemv instead), so a 1-token step gives what the unpatched build gives, bit for bit.
    code, lines = _run_check(small_batch_check, "--types", "q4_1,q6_K,q8_0,q5_0,q5_1", "--shapes", "4", "--vec-dot")
    assert set(lines) == {"q4_1", "q6_K", "q8_0", "q5_0", "q5_1"}, lines
    for line in lines.values():
        assert "1 token against vec_dot: " in line and line.endswith(" 0 differ"), line
    assert code == 0


@x86_only
def test_a_token_alone_gets_llama_cpps_own_gemv_result_where_it_repacks_the_weights(small_batch_check):
    # llama.cpp repacks Q4_0 and IQ4_NL 8 rows at a time and runs its gemv for a token; the patch's one-pass
    # kernel does the gemv's float operations in its order, so a 1-token step gives what the unpatched build gives.
    code, lines = _run_check(small_batch_check, "--types", "q4_0,iq4_nl", "--shapes", "6", "--gemv")
    assert set(lines) == {"q4_0", "iq4_nl"}, lines
    for line in lines.values():
        assert "1 token against llama.cpp's gemv: " in line and line.endswith(" 0 differ"), line
        assert "gemv: 0 outputs" not in line, line  # some shapes were repacked and compared
    assert code == 0


@x86_only
def test_the_check_finds_a_kernel_whose_batches_differ(small_batch_check):
    # Q3_K keeps llama.cpp's own kernels: vec_dot below 8 tokens, the tiled path (another float order) from 8.
    code, lines = _run_check(small_batch_check, "--types", "q3_K", "--shapes", "4", "--threads", "1")
    assert code == 1
    assert " 0 differ" not in lines["q3_K"] and "first at k = " in lines["q3_K"], lines


@x86_only
def test_a_q4_k_m_model_gives_1_token_logits_at_every_probed_batch_size(tmp_path):
    # The file llama.cpp's quantizer makes in Q4_K_M: Q4_K matrices, Q6_K output (tied embeddings) and ffn_down.
    # Loaded as the app loads models, so llama.cpp repacks whatever it repacks on this CPU.
    model = build_shape(SHAPES["test-256"], tmp_path / "test-256-q4_k_m.gguf", "q4_k_m")
    assert {"Q4_K", "Q6_K"} <= set(model.tensor_types)
    with Engine(model.path, n_ctx=1024, n_threads=2) as eng:
        assert probe_exact_batch(eng) == max(EXACT_PROBE_SIZES)


@x86_only
def test_an_iq4_nl_model_gives_1_token_logits_at_every_probed_batch_size(tmp_path):
    # IQ4_NL matrices, repacked by llama.cpp (as Q4_0's are): the patch's one-pass kernel for batches of up to
    # 16 tokens, llama.cpp's gemm past that, both in its gemv's order.
    model = build_shape(SHAPES["test-256"], tmp_path / "test-256-iq4_nl.gguf", "iq4_nl")
    assert "IQ4_NL" in set(model.tensor_types)
    with Engine(model.path, n_ctx=1024, n_threads=2) as eng:
        assert probe_exact_batch(eng) == max(EXACT_PROBE_SIZES)


@x86_only
def test_a_q5_k_m_model_is_exact_as_far_as_the_build_says(tmp_path):
    # Q5_K matrices: a tile for batches where the build names one (AVX-512), else llama.cpp's kernels, whose
    # tiled path takes over at 8 tokens. Either way the probe finds what the build's own list says.
    model = build_shape(SHAPES["test-256"], tmp_path / "test-256-q5_k_m.gguf", "q5_k_m")
    assert "Q5_K" in set(model.tensor_types)
    kernels = {k.ggml_type: k for k in matrix_kernels(model.tensor_types, backend.system_features())}
    expected = max(EXACT_PROBE_SIZES) if kernels["Q5_K"].exact_up_to is EVERY_SIZE else kernels["Q5_K"].exact_up_to
    with Engine(model.path, n_ctx=1024, n_threads=2) as eng:
        assert probe_exact_batch(eng) == expected


# --- what engine tune and the model info say about a model's kernels (engine/llama/kernels.py), pinned CPUs ---

# what a patched build reports, on AVX-512 and AVX2-only x86 CPUs
AVX512 = {"AVX2": "1", "FMA": "1", "AVX512": "1",
          "BATCH_KERNELS": "Q4_1 tile,Q4_K tile,Q6_K tile,Q8_0 tile-batches,Q5_0 tile-batches,Q5_K tile-batches,"
                           "Q4_0 repacked-batches,IQ4_NL repacked-batches,Q5_1 tile-batches"}
AVX2_ONLY = {"AVX2": "1", "FMA": "1", "AVX512": "0",
             "BATCH_KERNELS": "Q4_1 tile-batches,Q4_K repacked-batches,Q6_K tile-batches,Q8_0 tile-batches,"
                              "Q5_0 tile-batches,Q4_0 repacked-batches,IQ4_NL repacked-batches,Q5_1 tile-batches"}


def test_a_q4_k_m_model_is_exact_at_every_size_on_avx512_and_avx2_builds_alike():
    types = {"Q4_K": 96, "Q6_K": 17}
    on_512 = matrix_kernels(types, AVX512, machine="x86_64")
    on_avx2 = matrix_kernels(types, AVX2_ONLY, machine="x86_64")
    assert [k.ggml_type for k in on_512] == ["Q4_K", "Q6_K"]  # most tensors first
    assert all(k.exact_up_to is EVERY_SIZE for k in on_512 + on_avx2)
    assert "tile" in on_512[0].kernel and "repacked" in on_avx2[0].kernel
    assert on_512[0].describe == "Q4_K (96): one-pass tile kernel (patched); every batch size gives 1-token results"


def test_a_q5_k_m_file_is_exact_at_every_size_where_the_build_has_the_q5_k_tile():
    types = {"Q5_K": 96, "Q6_K": 17}
    on_512 = {k.ggml_type: k for k in matrix_kernels(types, AVX512, machine="x86_64")}
    on_avx2 = {k.ggml_type: k for k in matrix_kernels(types, AVX2_ONLY, machine="x86_64")}
    assert on_512["Q5_K"].exact_up_to is EVERY_SIZE and "tile" in on_512["Q5_K"].kernel
    assert on_avx2["Q5_K"].exact_up_to == 7 and on_avx2["Q6_K"].exact_up_to is EVERY_SIZE


def test_a_small_models_q4_k_m_file_with_q5_0_and_q8_0_fallbacks_is_exact_at_every_size():
    # Gemma 3 270M's Q4_K_M file: rows of 640 values fall back to Q5_0, and its output matrix is Q8_0.
    types = {"Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    for features in (AVX512, AVX2_ONLY):
        kernels = {k.ggml_type: k for k in matrix_kernels(types, features, machine="x86_64")}
        assert kernels["Q5_0"].exact_up_to is EVERY_SIZE and kernels["Q8_0"].exact_up_to is EVERY_SIZE
        assert "tile" in kernels["Q8_0"].kernel and "vec_dot" in kernels["Q8_0"].kernel
    no_avx2 = matrix_kernels(types, {"AVX2": "0", "FMA": "0", "AVX512": "0", "BATCH_KERNELS": ""}, machine="x86_64")
    assert all(k.exact_up_to != EVERY_SIZE for k in no_avx2), no_avx2


def test_an_iq4_nl_file_is_exact_at_every_size_on_a_patched_build_and_probed_on_an_unpatched_one():
    types = {"IQ4_NL": 141, "Q5_1": 24, "Q8_0": 1}
    for features in (AVX512, AVX2_ONLY):
        kernels = {k.ggml_type: k for k in matrix_kernels(types, features, machine="x86_64")}
        assert kernels["IQ4_NL"].exact_up_to is EVERY_SIZE and "one pass" in kernels["IQ4_NL"].kernel
    unpatched = {k: v for k, v in AVX512.items() if k != "BATCH_KERNELS"}
    kernels = {k.ggml_type: k for k in matrix_kernels(types, unpatched, machine="x86_64")}
    # llama.cpp repacks rows that come 8 at a time (exact) and gives the others tinyBLAS: the probe decides
    assert kernels["IQ4_NL"].exact_up_to == 0 and "repacked" in kernels["IQ4_NL"].kernel
    assert kernels["IQ4_NL"].describe.endswith("batches are checked on the model")


def test_a_small_models_q5_k_m_file_with_q5_1_fallbacks_is_exact_at_every_size_with_a_tile():
    # Qwen2.5 0.5B's Q5_K_M file: rows of 896 values fall back to Q5_1
    types = {"Q5_1": 132, "Q8_0": 13, "Q6_K": 12, "Q5_K": 12}
    for features in (AVX512, AVX2_ONLY):
        kernels = {k.ggml_type: k for k in matrix_kernels(types, features, machine="x86_64")}
        assert kernels["Q5_1"].exact_up_to is EVERY_SIZE and "tile" in kernels["Q5_1"].kernel
    unpatched = {k: v for k, v in AVX512.items() if k != "BATCH_KERNELS"}
    kernels = {k.ggml_type: k for k in matrix_kernels(types, unpatched, machine="x86_64")}
    assert kernels["Q5_1"].exact_up_to != EVERY_SIZE and "patched" not in kernels["Q5_1"].kernel


def test_a_llama_cpp_without_our_patches_is_not_claimed_exact():
    # the same CPU features, no BATCH_KERNELS: llama.cpp's own kernels, whose limits the probe finds
    unpatched = {k: v for k, v in AVX512.items() if k != "BATCH_KERNELS"}
    kernels = {k.ggml_type: k for k in matrix_kernels({"Q4_1": 30, "Q4_K": 96, "Q6_K": 17, "Q8_0": 10}, unpatched,
                                                      machine="x86_64")}
    assert all(k.exact_up_to != EVERY_SIZE and "patched" not in k.kernel for k in kernels.values()), kernels
    assert kernels["Q4_K"].exact_up_to == 3 and kernels["Q6_K"].exact_up_to == 7


def test_the_limit_a_probe_finds_is_put_down_to_the_weights_whose_kernels_set_it():
    kernels = matrix_kernels({"Q3_K": 80, "Q6_K": 30, "F32": 1}, AVX512, machine="x86_64")
    said = explain_exact_limit(kernels, 7, 128)
    assert said.startswith("batches up to 7 tokens give logits identical to a 1-token step")
    assert "Q3_K" in said and "Q6_K" not in said
    assert "all sizes probed" in explain_exact_limit(kernels, 128, 128)
    f16 = matrix_kernels({"F16": 10}, AVX512, machine="x86_64")
    assert "lookahead is off" in explain_exact_limit(f16, 0, 128)
    assert "F16" in explain_exact_limit(f16, 1, 128)  # one token vec_dot, a batch tinyBLAS
    assert "F16" not in explain_exact_limit(f16, 7, 128)  # a limit the kernels do not explain is not put on them


def test_other_architectures_are_not_claimed_exact():
    (kernel,) = matrix_kernels({"Q4_K": 10}, {"NEON": "1"}, machine="aarch64")
    assert kernel.exact_up_to == 0 and "x86 only" in kernel.kernel

"""A damaged model file never kills the process: header checks, the load probe, and seeded fuzzing.

Each header check has a file written here with gguf's GGUFWriter that trips exactly that check
(the same file without the defect loads in llama.cpp). The probe is tried with a child that loads,
one that llama.cpp refuses, one that llama.cpp really aborts on, and injected children that die
by a signal or hang. The fuzz runs ``python -m engine generate`` on seeded damaged copies of the
bundled model (tests/helpers/damage.py): every copy must answer or be refused in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine import ModelFileError, check_gguf
from engine.llama import backend, probe, problems, ram
from engine.llama.probe import ProbeResult, ensure_loadable, run_probe
from tests.helpers import damage
from tests.helpers.tiny_models import TOKENS

ROOT = Path(__file__).resolve().parents[3]
N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 64, 4, 2, 128, 2
HEAD_DIM = N_EMBD // N_HEAD


# --- a tiny llama model whose every part can be spoiled -------------------------------------------------------


def write_model(
    path: Path,
    tokens: list[str] | list[bytes] = TOKENS,
    scores: list[float] | None = None,
    token_types: list[int] | None = None,
    hparams: dict[str, int] | None = None,
    n_vocab_rows: int | None = None,
    edit: Callable[[object], None] | None = None,
) -> Path:
    """A 2-layer llama model (random F32 weights) with a byte-level SPM vocabulary, valid unless told otherwise.

    ``tokens``/``scores``/``token_types`` replace the vocabulary's arrays (default: consistent with
    ``tokens``), ``hparams`` overrides hyper-parameters in the metadata only (tensors keep their true
    shapes), ``n_vocab_rows`` the rows of the embedding and output matrices, ``edit`` adds or replaces
    metadata on the writer last.
    """
    import gguf

    n = len(tokens)
    rows = n_vocab_rows if n_vocab_rows is not None else n
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    hp = {"block_count": N_LAYER, "feed_forward_length": N_FF, "head_count": N_HEAD, "head_count_kv": N_HEAD_KV}
    hp.update(hparams or {})
    writer = _Writer(str(path), "llama")
    writer.add_name("spoilable-test")
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(hp["block_count"])
    writer.add_feed_forward_length(hp["feed_forward_length"])
    writer.add_head_count(hp["head_count"])
    writer.add_head_count_kv(hp["head_count_kv"])
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    t = gguf.GGUFValueType
    default_scores = [0.0] * min(n, 259) + [-float(i) for i in range(n - 259)]
    default_types = ([2, 3, 3] + [6] * 256 + [1] * n)[:n]
    # add_key_value, not add_token_list & co.: those skip an empty list, which is one of the cases
    writer.add_key_value("tokenizer.ggml.tokens", list(tokens), t.ARRAY, sub_type=t.STRING)
    writer.add_key_value("tokenizer.ggml.scores", scores if scores is not None else default_scores, t.ARRAY,
                         sub_type=t.FLOAT32)
    writer.add_key_value("tokenizer.ggml.token_type", token_types if token_types is not None else default_types,
                         t.ARRAY, sub_type=t.INT32)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    if edit is not None:
        edit(writer)
    writer.add_tensor("token_embd.weight", w(rows, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", w(rows, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _writer_class():
    import gguf

    class Writer(gguf.GGUFWriter):
        """GGUFWriter that also writes an empty array (gguf refuses to; a damaged file can hold one)."""

        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
                return (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type) + self._pack("Q", 0)
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    return Writer


def _Writer(*args, **kwargs):
    return _writer_class()(*args, **kwargs)


def set_array(key: str, values: list, item_type) -> Callable[[object], None]:
    """An ``edit`` that stores ``values`` under ``key`` as an array of ``item_type``."""
    import gguf

    def edit(writer) -> None:
        writer.kv_data[0].pop(key, None)
        writer.add_key_value(key, values, gguf.GGUFValueType.ARRAY, sub_type=item_type)

    return edit


def set_uint32(key: str, value: int) -> Callable[[object], None]:
    def edit(writer) -> None:
        writer.kv_data[0].pop(key, None)
        writer.add_uint32(key, value)

    return edit


def duplicated(tokens: list[str], keep: int, copy_of: int) -> list[str]:
    """``tokens`` with the token at ``keep`` replaced by the text of the one at ``copy_of``."""
    out = list(tokens)
    out[keep] = out[copy_of]
    return out


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spoiled-models")


@pytest.fixture(scope="module")
def intact(models_dir) -> Path:
    return write_model(models_dir / "intact.gguf")


@pytest.fixture
def no_probe_cache(tmp_path) -> Path:
    """A probe cache of this test's own."""
    return tmp_path / "probe-cache.json"


# --- the header checks ----------------------------------------------------------------------------------------


def test_the_intact_tiny_model_passes_the_header_check_and_loads_in_llama_cpp(intact, no_probe_cache):
    summary = check_gguf(intact)
    assert summary.n_tensors == 3 + 9 * N_LAYER
    result = ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache)
    assert result.probed and result.seconds > 0


SPOILED: dict[str, tuple[dict, str]] = {
    # name: (write_model arguments, the words the message must hold)
    "two tokens with the same text": (
        {"tokens": duplicated(TOKENS, keep=270, copy_of=265)},
        "the vocabulary has two tokens with the same text (id 265 and 270)",
    ),
    "two tokens the same up to a NUL byte": (
        {"tokens": [t.encode() for t in TOKENS[:-2]] + [b"zz\0a", b"zz\0b"]},
        f"the vocabulary has two tokens with the same text (id {len(TOKENS) - 2} and {len(TOKENS) - 1})",
    ),
    "an empty vocabulary": ({"tokens": [], "scores": [], "token_types": []}, "its vocabulary is empty"),
    "fewer scores than tokens": ({"scores": [0.0] * (len(TOKENS) - 1)},
                                 f"has {len(TOKENS)} tokens but {len(TOKENS) - 1} scores"),
    "more token types than tokens": ({"token_types": [1] * (len(TOKENS) + 3)},
                                     f"has {len(TOKENS)} tokens but {len(TOKENS) + 3} token types"),
    "token types of the wrong type": (
        {"edit": "token_type_u8"}, "token types (tokenizer.ggml.token_type) are of type uint8, not int32"),
    "scores of the wrong type": (
        {"edit": "scores_i32"}, "token scores (tokenizer.ggml.scores) are of type int32, not float32"),
    "tokens that are not strings": (
        {"edit": "tokens_u32"}, "vocabulary (tokenizer.ggml.tokens) is an array of uint32, not of strings"),
    "merges that are not strings": (
        {"edit": "merges_i32"}, "merges (tokenizer.ggml.merges) are an array of int32, not of strings"),
    "an eos id outside the vocabulary": (
        {"edit": "eos_far"},
        f"eos token id {len(TOKENS) + 7} (tokenizer.ggml.eos_token_id) "
        f"is outside its vocabulary of {len(TOKENS)} tokens"),
    "a bos id outside the vocabulary": ({"edit": "bos_far"}, "its bos token id 4294967295"),
    "a feed-forward length that disagrees with the tensors": (
        {"hparams": {"feed_forward_length": 100}},
        "tensor 'blk.0.ffn_gate.weight' is 64 x 128 but its hyper-parameters make it 64 x 100",
    ),
    "a head count that disagrees with the tensors": (
        {"hparams": {"head_count_kv": 1}},
        "tensor 'blk.0.attn_k.weight' is 64 x 32 but its hyper-parameters make it 64 x 16",
    ),
    "a block count smaller than the blocks": (
        {"hparams": {"block_count": 1}},
        "tensor 'blk.1.attn_norm.weight' belongs to block 1 but llama.block_count is 1",
    ),
    "more tokens than embedding rows": (
        {"tokens": TOKENS + ["zz"], "n_vocab_rows": len(TOKENS)},
        f"tensor 'token_embd.weight' is 64 x {len(TOKENS)} but its hyper-parameters make it 64 x {len(TOKENS) + 1}",
    ),
}


def _edits() -> dict[str, Callable[[object], None]]:
    import gguf

    t = gguf.GGUFValueType
    n = len(TOKENS)
    return {
        "token_type_u8": set_array("tokenizer.ggml.token_type", [1] * n, t.UINT8),
        "scores_i32": set_array("tokenizer.ggml.scores", [0] * n, t.INT32),
        "tokens_u32": set_array("tokenizer.ggml.tokens", list(range(n)), t.UINT32),
        "merges_i32": set_array("tokenizer.ggml.merges", [1, 2, 3], t.INT32),
        "eos_far": set_uint32("tokenizer.ggml.eos_token_id", n + 7),
        "bos_far": set_uint32("tokenizer.ggml.bos_token_id", 2**32 - 1),
    }


@pytest.mark.parametrize("name", list(SPOILED))
def test_each_spoiled_vocabulary_or_shape_is_refused_with_its_own_message(name, models_dir):
    kwargs, words = SPOILED[name]
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("edit"), str):
        kwargs["edit"] = _edits()[kwargs["edit"]]
    path = write_model(models_dir / f"{name.replace(' ', '-')}.gguf", **kwargs)
    with pytest.raises(ModelFileError) as info:
        check_gguf(path)
    message = str(info.value)
    assert words in message, message
    assert message.endswith(f", so the file is damaged: {path}")
    assert "\n" not in message


def test_a_padding_id_past_the_vocabulary_is_let_through_as_llama_cpp_ignores_it(models_dir, no_probe_cache):
    path = write_model(models_dir / "pad-past-end.gguf",
                       edit=set_uint32("tokenizer.ggml.padding_token_id", len(TOKENS)))
    check_gguf(path)
    assert ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache).probed


@pytest.mark.timing
def test_the_header_check_stays_fast_on_a_262k_token_vocabulary(tmp_path):
    import gguf

    n = 262_144
    path = tmp_path / "big-vocab.gguf"
    tokens = [f"tok{i:06d}{chr(0x4E00 + i % 2000)}" for i in range(n)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * n)
    writer.add_token_scores([0.0] * n)
    writer.add_eos_token_id(n - 1)
    writer.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    check_gguf(path)
    best = min(_timed(check_gguf, path) for _ in range(3))
    # Real time, against the least a duplicate check must do, timed here in the same run: each token's text
    # as bytes, into a set (~0.03 s on a quiet PC; check_gguf takes 2-4x that). 0.5 s, or 20x that least work
    # when other programs slow this machine, still fails a check that compares tokens pairwise or builds
    # the vocabulary's arrays as gguf's reader does (about 9 s here).
    least = min(_timed(lambda: {t.encode() for t in tokens}) for _ in range(3))
    assert best < max(0.5, 20 * least), f"check_gguf took {best:.2f} s on {n} tokens (a set of them: {least:.3f} s)"
    # ...and a duplicate among them is still found, and named
    data = bytearray(path.read_bytes())
    was, becomes = f"tok200001{chr(0x4E01)}".encode(), f"tok200000{chr(0x4E00)}".encode()
    at = data.find(was)
    data[at : at + len(was)] = becomes
    bad = tmp_path / "big-vocab-dup.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"same text \(id 200000 and 200001\)"):
        check_gguf(bad)


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


# --- the probe ----------------------------------------------------------------------------------------------------


@pytest.mark.timing
def test_a_file_that_loaded_before_skips_the_probe_until_it_changes(models_dir, no_probe_cache, monkeypatch):
    path = write_model(models_dir / "probe-twice.gguf")
    first = ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache)
    assert first.probed and 0 < first.seconds < 60
    with monkeypatch.context() as patch:  # known: no child process is started, however fast it would be
        patch.setattr(probe, "run_probe", lambda *_a, **_k: pytest.fail("probed a file known to load"))
        second = ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache)
    assert second == ProbeResult(probed=False, seconds=0.0)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # "the file changed"
    assert ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache).probed
    with monkeypatch.context() as patch:  # the same file, another llama.cpp build: probed again
        patch.setattr(backend, "build_id", lambda: "another build")
        assert ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache).probed


def test_the_bundled_model_is_probed_once_then_known(model_path, no_probe_cache):
    first = ensure_loadable(model_path, n_ctx=1024, n_threads=1, cache=no_probe_cache)
    again = ensure_loadable(model_path, n_ctx=1024, n_threads=1, cache=no_probe_cache)
    assert first.probed and not again.probed
    assert str(model_path.resolve()) in no_probe_cache.read_text()


def test_llama_cpps_real_abort_on_a_duplicate_token_becomes_one_line_naming_the_assert(models_dir):
    # The header check would refuse this file first; the probe alone must still survive it.
    path = write_model(models_dir / "dup-for-probe.gguf", tokens=duplicated(TOKENS, keep=270, copy_of=265))
    with pytest.raises(ModelFileError) as info:
        run_probe(path, n_ctx=256, n_threads=1)
    message = str(info.value)
    assert message.startswith("llama.cpp crashed (SIGABRT) loading the model: ")
    assert "GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed" in message
    assert message.endswith(f"the file is damaged: {path}") and "\n" not in message


def test_a_file_llama_cpp_refuses_cleanly_is_refused_with_its_reason_and_not_remembered(models_dir, no_probe_cache):
    path = write_model(models_dir / "bad-rope.gguf", edit=set_uint32("llama.rope.dimension_count", HEAD_DIM // 2))
    check_gguf(path)  # nothing the header check looks at
    for _ in range(2):  # refused again: a failed probe is not remembered
        with pytest.raises(ModelFileError) as info:
            ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache)
        message = str(info.value)
        assert message.startswith("llama.cpp cannot load the model: ")
        assert f"invalid n_rot: {HEAD_DIM // 2}, expected {HEAD_DIM}" in message and message.endswith(str(path))
    assert not no_probe_cache.exists()


CRASHES = {
    "SIGABRT": "import os, sys; sys.stderr.write('/src/ggml/llama-vocab.cpp:99: GGML_ASSERT(a == b) failed\\n'); "
               "os.abort()",
    "SIGSEGV": "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
}


@pytest.mark.parametrize("signame", list(CRASHES))
def test_a_child_that_dies_by_a_signal_becomes_a_model_file_error_naming_the_signal(signame, intact, no_probe_cache):
    with pytest.raises(ModelFileError) as info:
        ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache,
                        command=[sys.executable, "-c", CRASHES[signame]])
    message = str(info.value)
    assert message.startswith(f"llama.cpp crashed ({signame}) loading the model")
    assert message.endswith(f"the file is damaged: {intact}") and "\n" not in message
    if signame == "SIGABRT":
        assert ": GGML_ASSERT(a == b) failed — " in message
    assert not no_probe_cache.exists()


def test_the_crash_message_quotes_the_assert_an_uncaught_exception_or_nothing_but_never_a_mere_warning():
    useful = probe._useful_line
    assert useful("load: a warning\n/x/ggml/src/ggml.c:12: GGML_ASSERT(n > 0) failed\n") == "GGML_ASSERT(n > 0) failed"
    uncaught = "terminate called after throwing an instance of 'std::out_of_range'\n  what():  vector::_M_range_check\n"
    expected = "terminate called after throwing an instance of 'std::out_of_range': vector::_M_range_check"
    assert useful(uncaught) == expected
    assert useful("/src/llama-vocab.cpp:1530: fatal error\n") == "llama-vocab.cpp: fatal error"
    assert useful("load: control-looking token: 12 '<x>' was not control-type\n") == ""


def test_a_child_killed_for_lack_of_memory_says_so(intact, no_probe_cache):
    with pytest.raises(ModelFileError, match=r"killed \(SIGKILL\), most likely for lack of memory"):
        ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache,
                        command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])


@pytest.mark.timing
def test_a_child_that_hangs_is_stopped_at_the_timeout_and_becomes_a_model_file_error(intact, no_probe_cache):
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match=r"took longer than 1 s in a test process, which was stopped"):
        ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache, timeout=1.0,
                        command=[sys.executable, "-c", "import time; time.sleep(60)"])
    assert time.perf_counter() - t0 < 10


@pytest.mark.timing
def test_a_probe_can_be_cancelled_from_another_thread_and_leaves_no_child(intact, no_probe_cache, tmp_path):
    import threading

    pid_file = tmp_path / "child.pid"
    cancel = threading.Event()
    cancelled_at: list[float] = []

    def cancel_once_the_child_runs() -> None:  # not after a fixed delay: a busy machine starts Python slowly
        while not pid_file.exists() and not cancel.wait(0.02):
            pass
        cancelled_at.append(time.perf_counter())
        cancel.set()

    canceller = threading.Thread(target=cancel_once_the_child_runs)
    canceller.start()
    child = (f"import os, time; p = {str(pid_file)!r}; open(p + '.tmp', 'w').write(str(os.getpid())); "
             "os.replace(p + '.tmp', p); time.sleep(60)")
    try:
        with pytest.raises(probe.ProbeCancelled):
            ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache, cancel=cancel,
                            command=[sys.executable, "-c", child])
    finally:
        cancel.set()
        canceller.join()
    # Real time: the probe looks at ``cancel`` every fifth of a second; 5 s is ample on a loaded machine, and
    # far from the child's 60 s.
    assert time.perf_counter() - cancelled_at[0] < 5
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left running
    assert not no_probe_cache.exists()


def test_the_probe_timeout_grows_with_the_file_size():
    assert probe.probe_timeout(100 * 10**6) == pytest.approx(65.0)
    assert probe.probe_timeout(8 * 10**9) == pytest.approx(460.0)


def test_no_probe_runs_when_it_is_switched_off(intact, no_probe_cache, monkeypatch):
    monkeypatch.setenv("LOOKAHEAD_NO_PROBE", "1")
    result = ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache,
                             command=[sys.executable, "-c", "raise SystemExit(9)"])
    assert result == ProbeResult(False, 0.0)


def test_the_header_check_runs_before_the_probe_and_keeps_its_precise_message(tmp_path, no_probe_cache):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(ModelFileError, match="model file is empty"):
        ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache,
                        command=[sys.executable, "-c", "raise SystemExit(9)"])


def test_a_frozen_app_probes_with_its_own_executable_and_flag(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert probe.child_command("/m/x.gguf", 4096, 2) == [sys.executable, "--engine-probe", "/m/x.gguf", "--ctx", "4096",
                                                         "--threads", "2"]
    monkeypatch.setattr(sys, "frozen", False)
    assert probe.child_command("/m/x.gguf", 4096, 2)[1:3] == ["-m", "engine.decoding.load_check"]


def test_the_bundle_entry_script_runs_the_probe_without_importing_qt(intact):
    # As the frozen app would be started by the probe, with any import of Qt made to fail.
    script = (
        "import sys, runpy\n"
        "class NoQt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('PySide6', 'shiboken6', 'app'):\n"
        "            raise ImportError('the probe imported ' + name)\n"
        "sys.meta_path.insert(0, NoQt())\n"
        f"sys.argv = ['launch.py', '--engine-probe', {str(intact)!r}, '--ctx', '256', '--threads', '1']\n"
        f"runpy.run_path({str(ROOT / 'packaging' / 'launch.py')!r}, run_name='__main__')\n"
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), GGML_NO_BACKTRACE="1"))
    assert r.returncode == 0, r.stderr


def test_the_cli_turns_a_clean_llama_cpp_refusal_into_exit_2_with_one_line(models_dir, tmp_path):
    path = write_model(models_dir / "bad-rope-cli.gguf", edit=set_uint32("llama.rope.dimension_count", HEAD_DIM // 2))
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOOKAHEAD_CHAT_HOME=str(tmp_path / "home"))
    env.pop("LOOKAHEAD_NO_PROBE", None)
    r = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(path), "--prompt", "hi",
                        "--max-tokens", "2", "--threads", "1", "--ctx", "256"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: llama.cpp cannot load the model: "), r.stderr
    assert "invalid n_rot" in lines[0]


# --- what a person is told -----------------------------------------------------------------------------------------

# Each kind of bad file: (ModelFileError.kind, the start of its plain sentence, words of its technical detail).
PLAIN = {
    "not gguf": (problems.KIND_NOT_GGUF, "This file is not a GGUF model.", "bad magic"),
    "cut in its weights": (problems.KIND_TRUNCATED,
                           "This file is cut short: it holds 5 MB of the 98 MB the model needs.",
                           "tensors need 98362432 bytes, file has 5000000"),
    "cut in its header": (problems.KIND_TRUNCATED,
                          "This file is cut short or damaged: it holds 1 KB and ends partway through",
                          "file size 1000"),
    "newer version": (problems.KIND_VERSION, "This model file uses a newer GGUF version (4) than this app can read.",
                      "unknown GGUF version 4"),
    "version 1": (problems.KIND_VERSION, "This model file uses an old GGUF version (1)", "GGUF version 1"),
    "big-endian": (problems.KIND_VERSION, "This model file was made for a different kind of computer", "big-endian"),
    "empty": (problems.KIND_EMPTY, "This file is empty: it holds no model.", "model file is empty"),
    "folder": (problems.KIND_NOT_A_FILE, "This is a folder, not a model file.", "is a directory"),
    "missing": (problems.KIND_MISSING, "This model file is not there any more", "model file not found"),
}


@pytest.fixture(scope="module")
def bad_files(model_path, tmp_path_factory) -> dict[str, Path]:
    return damage.bad_model_files(model_path, tmp_path_factory.mktemp("bad-files"))


def _assert_plain(exc: ModelFileError | problems.ContextTooLargeError, path: Path | None = None) -> None:
    """The plain sentence names no path or file-format term; the technical detail is kept whole in str()."""
    assert exc.message and "\n" not in exc.message
    for jargon in ("magic", "tensor", "bytes", "GGML", "SIGKILL", "metadata", "/"):
        assert jargon not in exc.message, exc.message
    assert str(exc) == exc.detail != exc.message
    if path is not None:
        assert exc.detail.endswith(str(path))
    problem = problems.LoadProblem.from_exception(exc)
    assert problems.LoadProblem.from_text(problem.as_text()) == problems.LoadProblem(exc.message, exc.detail)


@pytest.mark.parametrize("name", list(PLAIN))
def test_each_kind_of_bad_file_is_told_in_a_plain_sentence_with_the_technical_detail_kept(name, bad_files):
    kind, sentence, technical = PLAIN[name]
    with pytest.raises(ModelFileError) as info:
        check_gguf(bad_files[name])
    exc = info.value
    assert exc.kind == kind
    assert exc.message.startswith(sentence), exc.message
    assert technical in exc.detail
    _assert_plain(exc, bad_files[name])


def test_a_file_that_cannot_be_read_says_so_in_plain_words(bad_files, monkeypatch):
    path = bad_files["not gguf"]
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if Path(p) == path else real_access(p, mode))
    with pytest.raises(ModelFileError) as info:
        check_gguf(path)
    assert info.value.kind == problems.KIND_UNREADABLE
    assert info.value.message == "This file cannot be opened: you do not have permission to read it."
    _assert_plain(info.value, path)


def test_a_spoiled_vocabulary_and_wrong_layer_sizes_are_told_as_damage_in_plain_words(models_dir):
    vocabulary = write_model(models_dir / "plain-eos.gguf", edit=_edits()["eos_far"])
    shapes = write_model(models_dir / "plain-ffn.gguf", hparams={"feed_forward_length": 100})
    for path, what in ((vocabulary, "its vocabulary"), (shapes, "its layer sizes disagree")):
        with pytest.raises(ModelFileError) as info:
            check_gguf(path)
        assert info.value.kind == problems.KIND_DAMAGED
        assert info.value.message.startswith(f"This model file is damaged: {what}")
        _assert_plain(info.value, path)


def test_an_architecture_llama_cpp_does_not_know_is_told_by_its_name(models_dir, no_probe_cache):
    import gguf

    def alien(writer) -> None:
        writer.kv_data[0].pop("general.architecture", None)
        writer.add_key_value("general.architecture", "no-such-arch", gguf.GGUFValueType.STRING)

    path = write_model(models_dir / "alien.gguf", edit=alien)
    with pytest.raises(ModelFileError) as info:
        ensure_loadable(path, n_ctx=256, n_threads=1, cache=no_probe_cache)
    assert info.value.kind == problems.KIND_ARCHITECTURE
    assert info.value.message == (
        'This model is of a kind (architecture "no-such-arch") that this app\'s version of llama.cpp cannot run.'
    )
    assert "unknown model architecture: 'no-such-arch'" in info.value.detail
    _assert_plain(info.value, path)


def test_running_out_of_memory_is_told_as_such_for_a_killed_test_load_and_a_context_too_large(
    intact, no_probe_cache
):
    with pytest.raises(ModelFileError) as info:
        ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache,
                        command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert info.value.kind == problems.KIND_MEMORY
    assert info.value.message.startswith("This PC ran out of memory loading the model.")
    _assert_plain(info.value, intact)

    summary = check_gguf(intact)
    with pytest.raises(problems.ContextTooLargeError) as too_large:
        ram.check_context_fits(summary, 100_000, available=summary.kv_cache_bytes(100_000) // 4)
    assert too_large.value.message.startswith(
        "This PC does not have enough free memory for a context of 100,000 tokens")
    assert "more than this machine's memory allows" in too_large.value.detail
    _assert_plain(too_large.value)


def test_a_crash_while_test_loading_is_told_as_a_damaged_file(intact, no_probe_cache):
    with pytest.raises(ModelFileError) as info:
        ensure_loadable(intact, n_ctx=256, n_threads=1, cache=no_probe_cache,
                        command=[sys.executable, "-c", CRASHES["SIGABRT"]])
    assert info.value.kind == problems.KIND_CRASHED
    assert info.value.message.startswith(
        "llama.cpp stopped while loading this file, so the file is most likely damaged")
    _assert_plain(info.value, intact)


def test_an_unexpected_error_is_told_as_unexpected_with_its_type_in_the_detail():
    problem = problems.LoadProblem.from_exception(KeyError("x"), "KeyError: 'x'")
    assert problem.message.startswith("Loading the model failed unexpectedly.")
    assert problem.detail == "KeyError: 'x'"


# --- fuzzing ------------------------------------------------------------------------------------------------------


def test_the_damage_generator_is_seeded_and_stays_in_the_first_two_megabytes(model_path):
    size = model_path.stat().st_size
    with open(model_path, "rb") as fh:
        head = fh.read(damage.LIMIT)
    fields = damage.u64_fields(head)
    assert fields[:2] == [8, 16] and len(fields) > 49_152  # the header counts, then one per token at least
    made = [damage.make_damage(i, 5, head, fields, size) for i in range(200)]
    assert made == [damage.make_damage(i, 5, head, fields, size) for i in range(200)]
    assert {d.kind for d in made} == set(damage.KINDS)
    for d in made:
        assert all(off + len(raw) <= damage.LIMIT and raw != head[off : off + len(raw)] for off, raw in d.patches)
        assert d.cut_to is None or d.cut_to < damage.LIMIT


def _assert_no_problems(outcomes: list[damage.CopyOutcome]) -> None:
    problems = [f"{o.damage.describe()}: {', '.join(o.problems())}: {o.stderr.strip()[-400:]}"
                for o in outcomes if o.problems()]
    assert not problems, "\n".join(problems)


@pytest.mark.model
@pytest.mark.timing
def test_five_dozen_damaged_copies_each_answer_or_are_refused_in_one_line(model_path):
    t0 = time.perf_counter()
    outcomes = damage.run_copies(model_path, count=60, seed=2024, jobs=2, timeout=150, extra_args=("--threads", "1"))
    assert len(outcomes) == 60
    _assert_no_problems(outcomes)
    kinds = {o.outcome for o in outcomes}
    assert "refused (exit 2)" in kinds, damage.summary(outcomes)  # the damage is real
    print(f"\n{damage.summary(outcomes)}\n({time.perf_counter() - t0:.0f} s)")


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timing
def test_a_thousand_damaged_copies_each_answer_or_are_refused_in_one_line(model_path):
    outcomes = damage.run_copies(model_path, count=1000, seed=1, jobs=2, extra_args=("--threads", "1"))
    assert len(outcomes) == 1000
    _assert_no_problems(outcomes)


def test_a_load_error_quotes_llama_cpps_reason_rather_than_the_failed_line_after_it(monkeypatch):
    from collections import deque


    lines = deque(["llama_model_load: error loading model: missing tensor 'output_norm.weight'\n",
                   "llama_model_load_from_file_impl: failed to load model\n"])
    monkeypatch.setattr(backend, "_log_lines", lines)
    assert backend.last_log_error() == "llama_model_load: error loading model: missing tensor 'output_norm.weight'"
    lines.append("llama_init_from_model: failed to allocate the KV cache\n")  # a later failure of its own
    lines.extend(["note\n"] * 4)
    lines.append("llama_decode: failed to decode\n")
    assert backend.last_log_error() == "llama_decode: failed to decode"

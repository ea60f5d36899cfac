"""Models in a real model's shape with random weights (engine/tools/shapes.py): the file llama.cpp makes of them loads,
generates, and holds the tensors and types a real file of that shape holds."""

from __future__ import annotations

import pytest

from engine import Engine, StopConfig
from engine.tools.cli import main
from engine.tools.shapes import QUANT_TYPES, SHAPES, ModelShape, build_shape, byte_vocab, tensor_plan


@pytest.fixture(scope="module")
def built_test_256(tmp_path_factory):
    return build_shape(SHAPES["test-256"], tmp_path_factory.mktemp("shape") / "test-256-q4_k_m.gguf", "q4_k_m")


def test_a_q4_k_m_build_loads_and_generates_greedily(built_test_256):
    with Engine(built_test_256.path, n_ctx=256, n_threads=2) as eng:
        assert eng.info.n_vocab == SHAPES["test-256"].n_vocab
        events = list(eng.generate(eng.tokenize("hello world"), stop=StopConfig(max_tokens=6)))
    tokens = [t for ev in events for t in ev.token_ids]
    assert len(tokens) == 6 or events[-1].stop_reason == "eog"
    assert all(0 <= t < SHAPES["test-256"].n_vocab for t in tokens)


def test_llama_cpp_chooses_q4_k_and_q6_k_for_q4_k_m_as_for_real_files(built_test_256):
    import gguf

    reader = gguf.GGUFReader(built_test_256.path)
    types = {t.tensor_type.name for t in reader.tensors}
    assert {"Q4_K", "Q6_K"} <= types
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embd.tensor_type.name == "Q6_K"  # tied embeddings: llama.cpp treats token_embd as the output matrix
    assert built_test_256.tensor_types == {
        name: sum(t.tensor_type.name == name for t in reader.tensors) for name in types}


def test_the_file_has_the_shape_tables_vocabulary_width_and_tensors(built_test_256):
    import gguf

    shape = SHAPES["test-256"]
    reader = gguf.GGUFReader(built_test_256.path)
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == shape.n_vocab
    assert int(reader.fields["llama.embedding_length"].contents()) == shape.n_embd
    assert int(reader.fields["llama.block_count"].contents()) == shape.n_layer
    assert sorted(t.name for t in reader.tensors) == sorted(t.name for t in tensor_plan(shape))
    assert "output.weight" not in {t.name for t in reader.tensors}
    assert not list(built_test_256.path.parent.glob("*.part"))  # the F16 intermediate is gone


@pytest.mark.parametrize(("name", "n_params"), [
    ("llama-1b", 1_235_814_400),  # the published parameter counts of the real models
    ("qwen2.5-0.5b", 494_032_768),
    ("smollm2-135m", 134_515_008),
    ("lfm2-1.2b", 1_170_340_608),
    ("llama-3b", 3_212_749_824),
    ("llama-8b", 8_030_261_248),
    ("qwen2.5-3b", 3_085_938_688),
    ("qwen2.5-7b", 7_615_616_512),
])
def test_each_real_shape_has_its_models_parameter_count(name, n_params):
    assert SHAPES[name].n_params == n_params


def test_qwen2_shapes_have_biases_on_q_k_and_v_only():
    names = {t.name for t in tensor_plan(SHAPES["qwen2.5-0.5b"]) if t.kind == "bias"}
    assert names == {f"blk.{i}.attn_{x}.bias" for i in range(24) for x in "qkv"}


def test_the_byte_vocabulary_has_exactly_the_asked_size_and_no_duplicates():
    for n in (260, 1024, 151936):
        tokens = byte_vocab(n)
        assert len(tokens) == len(set(tokens)) == n
        assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    with pytest.raises(ValueError, match="more than 259"):
        byte_vocab(259)


def test_an_f16_build_is_the_written_file_itself(tmp_path):
    built = build_shape(SHAPES["test-256"], tmp_path / "f16.gguf", "f16")
    assert built.tensor_types == {"F16": 1 + 7 * 2, "F32": 1 + 2 * 2}  # matrices; norms
    assert [p.name for p in tmp_path.iterdir()] == ["f16.gguf"]


def test_cli_list_names_every_shape(capsys):
    assert main(["shape", "--list"]) == 0
    out = capsys.readouterr().out
    for name in SHAPES:
        assert name in out


def test_cli_writes_the_file_and_says_what_it_holds(tmp_path, capsys):
    out = tmp_path / "t.gguf"
    assert main(["shape", "test-256", str(out), "--type", "q8_0", "--seed", "3"]) == 0
    said = capsys.readouterr().out
    assert str(out) in said and "Q8_0" in said and "20 tensors" in said
    assert out.exists()


def test_cli_refuses_an_unknown_shape_naming_the_known_ones(tmp_path, capsys):
    assert main(["shape", "llama-70b", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err
    assert "llama-70b" in err and all(name in err for name in SHAPES)
    assert not list(tmp_path.iterdir())


def test_cli_refuses_an_unknown_type_naming_the_known_ones(tmp_path, capsys):
    assert main(["shape", "test-256", str(tmp_path / "x.gguf"), "--type", "q3_k_xl"]) == 2
    err = capsys.readouterr().err
    assert "q3_k_xl" in err and all(name in err for name in QUANT_TYPES)
    assert not list(tmp_path.iterdir())


def test_cli_needs_a_name_and_a_file_without_list(capsys):
    assert main(["shape", "test-256"]) == 2
    assert "OUT.gguf" in capsys.readouterr().err


def test_hybrid_shapes_have_the_recurrent_layers_tensors_where_their_layout_puts_them():
    lfm2 = {t.name for t in tensor_plan(SHAPES["lfm2-1.2b"])}
    conv = [i for i in range(16) if f"blk.{i}.shortconv.conv.weight" in lfm2]
    attn = [i for i in range(16) if f"blk.{i}.attn_q.weight" in lfm2]
    assert conv == [0, 1, 3, 4, 6, 7, 9, 11, 13, 15] and attn == [2, 5, 8, 10, 12, 14]
    assert "token_embd_norm.weight" in lfm2 and "output.weight" not in lfm2  # its final norm; tied
    qwen = tensor_plan(SHAPES["qwen3.5-0.8b"])
    names = {t.name for t in qwen}
    assert [i for i in range(24) if f"blk.{i}.ssm_a" in names] == [i for i in range(24) if i % 4 != 3]
    assert [i for i in range(24) if f"blk.{i}.attn_q.weight" in names] == [3, 7, 11, 15, 19, 23]
    shapes = {t.name: t.shape for t in qwen}
    assert shapes["blk.0.attn_qkv.weight"] == (3 * 16 * 128, 1024)  # q, k and v of 16 heads of 128
    assert shapes["blk.3.attn_q.weight"] == (2 * 8 * 256, 1024)  # q and its gate
    assert {t.kind for t in qwen if t.name.endswith("ssm_a")} == {"decay"}


def test_a_shape_whose_layer_kinds_do_not_match_its_layers_is_refused():
    with pytest.raises(ValueError, match="'a' or 'r' for each of its 3 layers"):
        ModelShape("bad", "", "lfm2", n_embd=128, n_layer=3, n_head=2, n_head_kv=1, n_ff=256, n_vocab=300,
                   rope_theta=1e4, rms_eps=1e-5, context_length=512, layers="ra")


@pytest.mark.parametrize("arch", ["lfm2", "qwen35"])
def test_a_tiny_hybrid_shape_loads_as_a_hybrid_model_with_its_recurrent_state(tmp_path, arch):
    built = build_shape(SHAPES[f"test-{arch}"], tmp_path / f"{arch}.gguf", "q4_1", threads=1)
    with Engine(built.path, n_ctx=256, n_threads=2) as eng:
        assert eng.info.hybrid and eng.lookahead_kind == "drafts only"
        assert eng.summary.state_bytes > 0
        events = list(eng.generate(eng.tokenize("hello"), stop=StopConfig(max_tokens=4)))
    assert sum(e.n_committed for e in events) == 4 or events[-1].stop_reason == "eog"

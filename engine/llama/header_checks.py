"""What llama.cpp would crash on, or read out of bounds with, checked from a GGUF header's metadata.

llama.cpp validates the GGUF structure and throws on most bad values (wrong tensor shapes, missing keys), which
ends as an error. A few things it does not check abort the whole process (GGML_ASSERT) or read out of bounds
instead; ``check_vocabulary`` and ``check_tensor_shapes`` refuse those, each with its own message, and
models.check_gguf turns that into the file's problem.
"""

from __future__ import annotations

from gguf.constants import GGUFValueType

from engine.llama.gguf_header import TOKENS_KEY, Header, first_int


class MetadataDamaged(Exception):
    """Metadata that no intact file holds and llama.cpp would crash or misbehave on.

    ``plain``: what is damaged, in a few plain words ("its layer sizes disagree with each other").
    """

    def __init__(self, text: str, plain: str = "its vocabulary (the list of words it knows) is broken") -> None:
        super().__init__(text)
        self.plain = plain


# Special tokens that steer generation: llama.cpp replaces an id outside the vocabulary with the
# tokenizer's default (a warning only), so with a damaged eos id replies would no longer end where
# the model ends them. Others (pad, sep, mask, unk, fim_*) are replaced the same way and unused by
# chat; real files have a padding id just past the vocabulary, so those are let through.
_SPECIAL_TOKEN_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)
_NO_VOCAB_MODELS = ("no_vocab", "none")


def _type_name(item_type: int) -> str:
    try:
        return GGUFValueType(item_type).name.lower()
    except ValueError:
        return str(item_type)


def _llama_token_text(raw: bytes, token_id: int) -> bytes:
    """The text llama.cpp keys a token by: a C string (cut at the first NUL), "[EMPTY_<id>]" if empty."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raw = raw[:nul]
    return raw if raw else b"[EMPTY_%d]" % token_id


def check_vocabulary(header: Header) -> None:
    """The vocabulary checks llama.cpp's llama_vocab::impl::load does not make, or makes with GGML_ASSERT."""
    meta, arrays = header.metadata, header.arrays
    model = meta.get("tokenizer.ggml.model")
    if not isinstance(model, str) or model in _NO_VOCAB_MODELS:
        return  # no vocabulary, or no tokenizer key: llama.cpp refuses the latter with an error
    tokens = header.tokens
    if tokens is None:
        if TOKENS_KEY in arrays:  # read with gguf_get_arr_str, which asserts the items are strings
            found = _type_name(arrays[TOKENS_KEY][0])
            raise MetadataDamaged(f"its vocabulary ({TOKENS_KEY}) is an array of {found}, not of strings")
        if TOKENS_KEY in meta:
            raise MetadataDamaged(f"its vocabulary ({TOKENS_KEY}) is not an array")
        return  # no vocabulary at all: llama.cpp refuses it with an error
    n = len(tokens)
    if n == 0:
        raise MetadataDamaged("its vocabulary is empty")
    # llama.cpp maps text -> id and asserts that both directions have as many entries (id_to_token.size()
    # == token_to_id.size()): two tokens with the same text abort the process. Fast path: one set of bytes.
    texts = tokens
    unique = set(texts)
    if b"" in unique or b"\0" in b"".join(tokens):  # rare: redo with llama.cpp's view of each text
        texts = [_llama_token_text(t, i) for i, t in enumerate(tokens)]
        unique = set(texts)
    if len(unique) != n:
        first: dict[bytes, int] = {}
        for i, t in enumerate(texts):
            j = first.setdefault(t, i)
            if j != i:
                raise MetadataDamaged(f"the vocabulary has two tokens with the same text (id {j} and {i})")
    # Scores and types are read as plain float/int arrays, one per token, without a length check.
    for key, want, what in (
        ("tokenizer.ggml.scores", GGUFValueType.FLOAT32, "scores"),
        ("tokenizer.ggml.token_type", GGUFValueType.INT32, "token types"),
    ):
        if key in arrays:
            item_type, count = arrays[key]
            if item_type != want:
                raise MetadataDamaged(
                    f"its token {what} ({key}) are of type {_type_name(item_type)}, not {_type_name(want)}"
                )
            if count != n:
                raise MetadataDamaged(f"its vocabulary has {n} tokens but {count} {what}")
        elif key in meta:
            raise MetadataDamaged(f"its token {what} ({key}) are not an array")
    merges = "tokenizer.ggml.merges"
    if merges in arrays and arrays[merges][0] != GGUFValueType.STRING:  # gguf_get_arr_str asserts strings
        raise MetadataDamaged(f"its merges ({merges}) are an array of {_type_name(arrays[merges][0])}, not of strings")
    for key in _SPECIAL_TOKEN_KEYS:
        value = meta.get(key)  # read as uint32: llama.cpp refuses other types itself
        if isinstance(value, int) and not isinstance(value, bool) and value >= n:
            name = key.removeprefix("tokenizer.ggml.").removesuffix("_token_id")
            raise MetadataDamaged(f"its {name} token id {value} ({key}) is outside its vocabulary of {n} tokens")


# Architectures whose tensors have the standard llama layout (llama.cpp's llama/qwen2/qwen3 loaders):
# attention q/k/v/output, a gated feed-forward, norms, embeddings and the output matrix.
_STANDARD_LAYOUT = frozenset({"llama", "qwen2", "qwen3"})


def _per_layer(value: object, n_layer: int) -> list[int] | None:
    if isinstance(value, list):
        return [int(x) for x in value] if len(value) == n_layer and all(isinstance(x, int) for x in value) else None
    v = first_int(value)
    return [v] * n_layer if v is not None else None


def check_tensor_shapes(header: Header) -> None:
    """Tensors whose shapes disagree with the hyper-parameters (standard-layout architectures only).

    llama.cpp refuses these too ("wrong shape"), but only after reading the whole vocabulary; here the
    message names the tensor and the hyper-parameter, from the header alone.
    """
    meta = header.metadata
    arch = meta.get("general.architecture")
    if arch not in _STANDARD_LAYOUT:
        return
    n_layer = first_int(meta.get(f"{arch}.block_count"))
    n_embd = first_int(meta.get(f"{arch}.embedding_length"))
    if not n_layer or not n_embd or n_layer < 0 or n_embd < 0:
        return  # missing or zero: llama.cpp refuses these itself with an error
    heads = _per_layer(meta.get(f"{arch}.attention.head_count"), n_layer)
    heads_kv = _per_layer(
        meta.get(f"{arch}.attention.head_count_kv", meta.get(f"{arch}.attention.head_count")), n_layer
    )
    n_ff = _per_layer(meta.get(f"{arch}.feed_forward_length"), n_layer)
    n_vocab = len(header.tokens) if header.tokens is not None else None
    expected: dict[str, tuple[int, ...]] = {"output_norm.weight": (n_embd,)}
    if n_vocab:
        expected["token_embd.weight"] = expected["output.weight"] = (n_embd, n_vocab)
    for i in range(n_layer if n_layer <= 4096 else 0):  # more is refused by llama.cpp (at most 512 layers)
        b = f"blk.{i}."
        expected[b + "attn_norm.weight"] = expected[b + "ffn_norm.weight"] = (n_embd,)
        if heads and heads_kv and heads[i] > 0:
            k_len = first_int(meta.get(f"{arch}.attention.key_length")) or n_embd // heads[i]
            v_len = first_int(meta.get(f"{arch}.attention.value_length")) or n_embd // heads[i]
            expected[b + "attn_q.weight"] = (n_embd, heads[i] * k_len)
            expected[b + "attn_k.weight"] = (n_embd, heads_kv[i] * k_len)
            expected[b + "attn_v.weight"] = (n_embd, heads_kv[i] * v_len)
            expected[b + "attn_output.weight"] = (heads[i] * v_len, n_embd)
        if n_ff and n_ff[i] > 0:
            expected[b + "ffn_gate.weight"] = expected[b + "ffn_up.weight"] = (n_embd, n_ff[i])
            expected[b + "ffn_down.weight"] = (n_ff[i], n_embd)

    for t in header.tensors:
        want = expected.get(t.name)
        if want is not None and _significant(t.dims) != _significant(want):
            raise MetadataDamaged(
                f"tensor {t.name!r} is {_shape(t.dims)} but its hyper-parameters make it {_shape(want)}",
                "its layer sizes disagree with each other",
            )
        if t.name.startswith("blk."):
            block = t.name.split(".", 2)[1]
            if block.isdigit() and int(block) >= n_layer:
                raise MetadataDamaged(
                    f"tensor {t.name!r} belongs to block {block} but {arch}.block_count is {n_layer}",
                    "it has more layers than it says",
                )


def _shape(dims: tuple[int, ...]) -> str:
    return " x ".join(str(d) for d in dims)


def _significant(dims: tuple[int, ...]) -> tuple[int, ...]:
    while len(dims) > 1 and dims[-1] == 1:  # llama.cpp pads shapes with 1s: [576, 1] is [576]
        dims = dims[:-1]
    return dims

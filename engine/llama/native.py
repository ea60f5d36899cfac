"""The thin wrappers over llama.cpp's C API, through ctypes.

One Python owner per native object (model, context, sampler); each frees its
object in ``close()`` and a context is always freed before its model. A
non-zero status from llama.cpp raises ``NativeError`` with the code in the
message. Everything above this module works with Python ints and numpy arrays.
Loading llama.cpp itself (backends, log hook, build checks) is backend.py's; the
two are the only modules that touch llama.cpp through ctypes.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llama_cpp as ll
import numpy as np

from engine.llama.backend import NativeError, ensure_backend, last_log_error


def quantize_model(src: str | os.PathLike[str], dst: str | os.PathLike[str], ftype: str, threads: int) -> None:
    """Quantize the GGUF ``src`` to ``dst`` with llama.cpp's own quantizer (llama-quantize's rules); ``ftype``
    names a file type (``"LLAMA_FTYPE_MOSTLY_Q4_K_M"``)."""
    ensure_backend()  # llama.cpp's log goes to the engine's hook, which errors quote
    params = ll.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = getattr(ll, ftype)
    status = ll.llama_model_quantize(os.fsencode(src), os.fsencode(dst), params)
    if status != 0:
        detail = last_log_error()
        raise NativeError(f"llama.cpp could not quantize {src} to {ftype} (code {status})"
                          + (f": {detail}" if detail else ""))


# --- model --------------------------------------------------------------------

SPLITS_KEPT = 4096  # texts whose tokens a model keeps (Model.text_tokens); past that it starts over


@dataclass(frozen=True)
class ModelInfo:
    path: str
    description: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_vocab: int
    recurrent: bool
    hybrid: bool


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        progress: Callable[[float], bool] | None = None,
    ) -> None:
        ensure_backend()
        self.path = str(path)
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        self._progress_cb = None
        if progress is not None:

            def _cb(fraction: float, _user: ctypes.c_void_p) -> bool:
                try:
                    return bool(progress(float(fraction)))
                except Exception:  # a failing listener must not abort the load
                    return True

            self._progress_cb = ll.llama_progress_callback(_cb)
            params.progress_callback = self._progress_cb
        self._ptr = ll.llama_model_load_from_file(self.path.encode("utf-8"), params)
        if not self._ptr:
            detail = last_log_error()
            raise NativeError(f"llama.cpp could not load {self.path}" + (f": {detail}" if detail else ""))
        self._vocab = ll.llama_model_get_vocab(self._ptr)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        self._piece_buf = ctypes.create_string_buffer(256)
        self._dry_breakers: dict[int, bool] = {}
        self._pieces: tuple[dict[int, bytes], dict[int, bytes]] = ({}, {})  # token_bytes's, by ``special``
        self._splits: dict[str, tuple[int, ...]] = {}  # text_tokens's

    @property
    def ptr(self) -> ll.llama_model_p:
        if not self._ptr:
            raise NativeError("model is closed")
        return self._ptr

    @property
    def vocab(self) -> ll.llama_vocab_p:
        self.ptr  # noqa: B018 - raises once the model is closed
        return self._vocab

    def close(self) -> None:
        if self._ptr:
            ll.llama_model_free(self._ptr)
            self._ptr = None

    def info(self) -> ModelInfo:
        buf = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self.ptr, buf, ctypes.sizeof(buf))
        return ModelInfo(
            path=self.path,
            description=buf.value.decode("utf-8", errors="replace"),
            n_params=int(ll.llama_model_n_params(self.ptr)),
            size_bytes=int(ll.llama_model_size(self.ptr)),
            n_ctx_train=int(ll.llama_model_n_ctx_train(self.ptr)),
            n_vocab=self.n_vocab,
            recurrent=bool(ll.llama_model_is_recurrent(self.ptr)),
            hybrid=bool(ll.llama_model_is_hybrid(self.ptr)),
        )

    def chat_template(self) -> str | None:
        raw = ll.llama_model_chat_template(self.ptr, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    # --- vocabulary ---

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
            if n < 0:
                raise NativeError(f"tokenize failed ({n})")
        return list(arr[:n])

    def text_tokens(self, text: str) -> list[int]:
        """``text`` in tokens as written, no BOS: a control token's spelling in it ("<|im_end|>") is text.

        Kept once asked for: drafting under a grammar splits the same few texts (a key with its quotes, the
        closing of a string) at step after step, and a call into llama.cpp's tokenizer is dear beside the rest
        of a step's planning."""
        tokens = self._splits.get(text)
        if tokens is None:
            if len(self._splits) >= SPLITS_KEPT:
                self._splits.clear()
            tokens = self._splits[text] = tuple(self.tokenize(text, add_special=False, parse_special=False))
        return list(tokens)

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """``token``'s text as bytes (a control token's as b"" unless ``special``); kept once asked for: drafting
        asks for the same pieces at every step."""
        pieces = self._pieces[special]
        piece = pieces.get(token)
        if piece is None:
            buf = self._piece_buf
            n = ll.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
            piece = pieces[token] = bytes(buf.raw[:n])
        return piece

    def is_dry_breaker(self, token: int) -> bool:
        """Whether DRY treats ``token`` as a sequence breaker: its text holds one of ``DRY_BREAKERS``."""
        known = self._dry_breakers.get(token)
        if known is None:
            piece = self.token_bytes(token, special=True)
            known = self._dry_breakers[token] = any(b.encode("utf-8") in piece for b in DRY_BREAKERS)
        return known

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self._vocab, int(token)))

    def bos(self) -> int:
        return int(ll.llama_vocab_bos(self._vocab))

    def eos(self) -> int:
        return int(ll.llama_vocab_eos(self._vocab))

    def eot(self) -> int:
        """The end-of-turn token (-1: the vocabulary has none)."""
        return int(ll.llama_vocab_eot(self._vocab))

    def add_bos(self) -> bool:
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    def token_text(self, token: int) -> str:
        raw = ll.llama_vocab_get_text(self._vocab, int(token))
        return raw.decode("utf-8", errors="replace") if raw else ""


# --- batch ----------------------------------------------------------------------


class Batch:
    """A llama_batch whose buffers are numpy arrays owned here.

    Each token may belong to up to ``n_seq`` sequences. Filling is numpy slice
    assignment; the struct handed to ``llama_decode`` points into the arrays.
    """

    def __init__(self, capacity: int, n_seq: int) -> None:
        self.capacity = capacity
        self.n_seq = n_seq
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.zeros(capacity, dtype=np.int32)
        self.seq_matrix = np.zeros((capacity, n_seq), dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        row_bytes = self.seq_matrix.strides[0]
        base = self.seq_matrix.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ll.llama_seq_id) * capacity)(
            *[ctypes.cast(base + k * row_bytes, ctypes.POINTER(ll.llama_seq_id)) for k in range(capacity)]
        )
        self._struct = ll.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(ctypes.POINTER(ll.llama_token)),
            embd=ctypes.POINTER(ctypes.c_float)(),
            pos=self.pos.ctypes.data_as(ctypes.POINTER(ll.llama_pos)),
            n_seq_id=self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=self._seq_ptrs,
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )
        self.n_tokens = 0

    def set_single_seq(
        self, tokens: Sequence[int] | np.ndarray, start_pos: int, seqs: Sequence[int], last_logits: bool
    ) -> None:
        """Consecutive tokens at start_pos.., each in all of ``seqs``."""
        n = len(tokens)
        self._check(n)
        self.token[:n] = tokens
        self.pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
        self.n_seq_id[:n] = len(seqs)
        self.seq_matrix[:n, : len(seqs)] = np.asarray(seqs, dtype=np.int32)
        self.logits[:n] = 0
        if last_logits and n:
            self.logits[n - 1] = 1
        self.n_tokens = n

    def set_plan(
        self, tokens: np.ndarray, positions: np.ndarray, seq_ids: Sequence[Sequence[int]], logits: np.ndarray
    ) -> None:
        n = int(tokens.shape[0])
        self._check(n)
        self.token[:n] = tokens
        self.pos[:n] = positions
        self.logits[:n] = logits
        for k, seqs in enumerate(seq_ids):
            m = len(seqs)
            self.n_seq_id[k] = m
            self.seq_matrix[k, :m] = seqs
        self.n_tokens = n

    def _check(self, n: int) -> None:
        if n < 1 or n > self.capacity:
            raise NativeError(f"batch of {n} tokens does not fit the capacity {self.capacity}")

    def struct(self) -> ll.llama_batch:
        self._struct.n_tokens = self.n_tokens
        return self._struct


# --- context ----------------------------------------------------------------------


# The KV cache and attention, first choice first. An f16 cache with flash attention reads a prompt as fast as
# llama.cpp's default (f16, no flash attention); a Q8_0 cache took far longer (docs/SPEED.md, "The figures
# behind the code's constants"). The patch (packaging/, part 4) gives every row count ggml's tiled flash
# attention, so a query row gets the same arithmetic in a 1-token step and in a batch of any size, at any cache
# length and thread count. Without flash attention (llama.cpp turns it off for a few architectures) attention is
# two matmuls whose exactness the exact-batch probe measures.
KV_SETUPS = (("f16", ll.GGML_TYPE_F16, ll.LLAMA_FLASH_ATTN_TYPE_ENABLED),
             ("f16", ll.GGML_TYPE_F16, ll.LLAMA_FLASH_ATTN_TYPE_DISABLED))


class Context:
    """A llama.cpp context made for lookahead: ``n_seq_max`` sequences in one unified KV cache (``kv_type``,
    with ``flash_attn`` or not)."""

    def __init__(
        self, model: Model, n_ctx: int, n_batch: int, n_threads: int, n_seq_max: int, n_rs_seq: int = 0
    ) -> None:
        """``n_rs_seq``: recurrent states kept per sequence, so that a decode's last tokens can be taken back
        (``rollback``); llama.cpp keeps none for architectures that cannot."""
        self.model = model
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # one ubatch per step: no split inside a step
        params.n_seq_max = n_seq_max
        self.n_seq_max = n_seq_max
        params.n_rs_seq = n_rs_seq
        params.kv_unified = True
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        self._ptr = None
        self.kv_type = ""
        self.flash_attn = False
        for name, ggml_type, flash_attn in KV_SETUPS:
            params.type_k = params.type_v = ggml_type
            params.flash_attn_type = flash_attn
            self._ptr = ll.llama_init_from_model(model.ptr, params)
            if self._ptr:
                self.kv_type = name
                self.flash_attn = flash_attn == ll.LLAMA_FLASH_ATTN_TYPE_ENABLED
                break
        if not self._ptr:
            detail = last_log_error()
            raise NativeError(
                f"llama.cpp could not create a context of {n_ctx} tokens" + (f": {detail}" if detail else "")
            )
        self.n_ctx = int(ll.llama_n_ctx(self._ptr))
        self.n_batch = n_batch
        self.n_rs_seq = int(ll.llama_n_rs_seq(self._ptr)) if n_rs_seq else 0
        self.n_threads = n_threads
        self._mem = ll.llama_get_memory(self._ptr)
        self.n_vocab = model.n_vocab
        self._logits_key: tuple[int | None, int] = (None, 0)
        self._logits_view = np.zeros((0, self.n_vocab), dtype=np.float32)
        # Hears every decode: (batch, wall seconds, process CPU seconds); the engine's thread governor.
        self.on_decode: Callable[[Batch, float, float], None] | None = None

    @property
    def ptr(self) -> ll.llama_context_p:
        if not self._ptr:
            raise NativeError("context is closed")
        return self._ptr

    def close(self) -> None:
        if self._ptr:
            ll.llama_free(self._ptr)
            self._ptr = None

    def set_threads(self, n_threads: int) -> None:
        """Decode with ``n_threads`` from the next decode on (prompt batches too)."""
        ll.llama_set_n_threads(self.ptr, n_threads, n_threads)
        self.n_threads = n_threads

    def decode(self, batch: Batch) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        rc = ll.llama_decode(self.ptr, batch.struct())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if rc != 0:
            reason = {1: "no room in the KV cache", 2: "aborted"}.get(rc, "error")
            detail = last_log_error()
            raise NativeError(f"llama_decode failed with code {rc} ({reason})" + (f": {detail}" if detail else ""))
        if self.on_decode is not None:
            self.on_decode(batch, wall, cpu)

    def logits_rows(self, n_rows: int) -> np.ndarray:
        """The logits of the last decode as a [n_rows, n_vocab] view (rows in batch order).

        The view is valid until the next decode. One view is kept per buffer address, as many rows as a decode
        has given there, and sliced: building one through ctypes costs more than a small step's argmax, and
        llama.cpp only ever moves the buffer to grow it.
        """
        ptr = ll.llama_get_logits(self.ptr)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if address != self._logits_key[0] or n_rows > self._logits_key[1]:
            if not ptr:
                raise NativeError("the last decode produced no logits")
            self._logits_view = np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
            self._logits_key = (address, n_rows)
        return self._logits_view[:n_rows]

    def logits_at(self, batch_index: int) -> np.ndarray:
        ptr = ll.llama_get_logits_ith(self.ptr, batch_index)
        if not ptr:
            raise NativeError(f"no logits for batch index {batch_index}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    # --- KV cache (llama_memory_*) ---

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not ll.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise NativeError(f"this model's memory cannot remove positions {p0}..{p1} of sequence {seq}")

    def rollback(self, seq: int, p0: int) -> None:
        """Take back positions ``p0``.. of ``seq``, the tail of the decode just run (at most ``n_rs_seq`` tokens,
        fewer than that decode held; once per decode): the recurrent state goes back to the one kept there."""
        self.seq_rm(seq, p0, -1)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        ll.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return int(ll.llama_memory_seq_pos_max(self._mem, seq))

    def seq_pos_min(self, seq: int) -> int:
        return int(ll.llama_memory_seq_pos_min(self._mem, seq))

    def clear(self) -> None:
        ll.llama_memory_clear(self._mem, True)

    def save_seq(self, seq: int) -> bytes:
        """What the cache holds for ``seq`` (its cells' positions, keys and values), to put back with ``load_seq``."""
        size = ll.llama_state_seq_get_size(self.ptr, seq)
        buf = (ctypes.c_uint8 * size)()
        written = ll.llama_state_seq_get_data(self.ptr, buf, size, seq)
        return bytes(buf)[:written]

    def load_seq(self, data: bytes, seq: int) -> bool:
        """Put ``save_seq``'s bytes back into ``seq`` (of an emptied cache: from its first cell, in position order,
        each value as it was); False if llama.cpp could not."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return bool(ll.llama_state_seq_set_data(self.ptr, buf, len(data), seq))


# --- sampler ----------------------------------------------------------------------


# DRY's sequence breakers, llama.cpp's defaults: a repeat is not followed across a line end, a colon, a quote or an
# asterisk, so lists, tables and dialogue whose lines share a shape are not penalised as one long repeat.
DRY_BREAKERS = ("\n", ":", '"', "*")
DRY_WINDOW = 8192  # DRY looks this far back in what the sampler was given: any reply and the prompt's tail it saw


class Sampler:
    """A llama.cpp sampler chain: the repetition penalty and DRY first, then greedy, or
    top-k/top-p/min-p/temperature with a seeded draw.

    ``sample`` draws and accepts in one call, so the penalty's window holds the
    drawn tokens in the order they were drawn; ``accept`` adds tokens that were
    not drawn (the prompt).
    """

    def __init__(self, model: Model, *, temperature: float, top_k: int, top_p: float, min_p: float, seed: int,
                 repeat_penalty: float, repeat_last_n: int, dry_multiplier: float = 0.0, dry_base: float = 1.75,
                 dry_allowed_length: int = 2) -> None:
        """The values of a ``SamplingConfig`` (engine/decoding/settings.py), which checks them: temperature 0 is
        greedy, top_k and min_p 0 are off, a repeat penalty of 1 or a window of 0 is off, DRY's multiplier 0 is
        off."""
        params = ll.llama_sampler_chain_default_params()
        params.no_perf = True
        self._ptr = ll.llama_sampler_chain_init(params)
        # Penalties act on the raw logits, before any filter, as llama.cpp's own sampler chains place them.
        if repeat_penalty != 1.0 and repeat_last_n > 0:
            penalties = ll.llama_sampler_init_penalties(model.n_vocab, repeat_last_n, repeat_penalty, 0.0, 0.0)
            ll.llama_sampler_chain_add(self._ptr, penalties)
        if dry_multiplier > 0.0:
            self._add_dry(model, dry_multiplier, dry_base, dry_allowed_length)
        if temperature <= 0.0:
            ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_top_k(top_k))
            ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_top_p(top_p, 1))
            if min_p > 0:
                ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_min_p(min_p, 1))
            ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_temp(temperature))
            ll.llama_sampler_chain_add(self._ptr, ll.llama_sampler_init_dist(seed))

    def _add_dry(self, model: Model, multiplier: float, base: float, allowed_length: int) -> None:
        breakers = (ctypes.c_char_p * len(DRY_BREAKERS))(*(b.encode("utf-8") for b in DRY_BREAKERS))
        dry = ll.llama_sampler_init_dry(model.vocab, multiplier, base, allowed_length, DRY_WINDOW, breakers,
                                        len(DRY_BREAKERS))
        if not dry:
            raise NativeError("llama.cpp could not make the DRY sampler")
        ll.llama_sampler_chain_add(self._ptr, dry)

    def accept(self, tokens: Sequence[int]) -> None:
        """Add ``tokens`` to the sampler's history, in order, without drawing."""
        for tok in tokens:
            ll.llama_sampler_accept(self._ptr, int(tok))

    def sample(self, ctx: Context, batch_index: int) -> int:
        """Draw the token at ``batch_index`` of the last decode (and accept it)."""
        return int(ll.llama_sampler_sample(self._ptr, ctx.ptr, batch_index))

    def close(self) -> None:
        if self._ptr:
            ll.llama_sampler_free(self._ptr)
            self._ptr = None

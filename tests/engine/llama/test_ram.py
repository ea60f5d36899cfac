"""The RAM check reads free memory through psutil (Linux, macOS, Windows) and keeps a container's cgroup cap.

psutil's figure is replaced here by a fixed one, and the cgroup v2 files are written to a temp dir, so each
test knows what the answer must be on any machine.
"""

from __future__ import annotations

from collections import namedtuple

import psutil
import pytest

from engine.llama import ram
from engine.llama.models import check_gguf
from engine.llama.problems import ContextTooLargeError
from engine.llama.ram import available_ram_bytes, check_context_fits

GiB = 2**30
FakeMemory = namedtuple("FakeMemory", "total available")


@pytest.fixture
def free_memory(monkeypatch):
    """Set what psutil reports as available memory, in bytes."""

    def set_available(n: int) -> None:
        monkeypatch.setattr(psutil, "virtual_memory", lambda: FakeMemory(total=64 * GiB, available=n))

    return set_available


@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """Write this process's cgroup v2 memory files (limit "max" is none), or point at a folder without them."""
    monkeypatch.setattr(ram, "CGROUP_DIR", tmp_path / "no-cgroup")

    def write(limit: str, current: int) -> None:
        (tmp_path / "memory.max").write_text(f"{limit}\n")
        (tmp_path / "memory.current").write_text(f"{current}\n")
        monkeypatch.setattr(ram, "CGROUP_DIR", tmp_path)

    return write


def test_free_memory_is_psutils_figure_where_no_cgroup_limits_it(free_memory, cgroup):
    free_memory(6 * GiB)
    assert available_ram_bytes() == 6 * GiB  # no cgroup files (Windows, macOS, most desktops)
    cgroup("max", 1 * GiB)
    assert available_ram_bytes() == 6 * GiB


def test_a_cgroup_limit_below_free_memory_caps_it_at_the_limit_less_what_the_group_uses(free_memory, cgroup):
    free_memory(6 * GiB)
    cgroup(str(2 * GiB), GiB // 2)
    assert available_ram_bytes() == 3 * GiB // 2
    cgroup(str(2 * GiB), 3 * GiB)
    assert available_ram_bytes() == 0  # the group is over its limit
    cgroup(str(64 * GiB), 0)
    assert available_ram_bytes() == 6 * GiB  # a limit looser than the machine


def test_unreadable_cgroup_files_leave_psutils_figure(free_memory, cgroup):
    free_memory(6 * GiB)
    cgroup("lots", 0)
    assert available_ram_bytes() == 6 * GiB


def test_free_memory_is_unknown_when_psutil_cannot_read_it(monkeypatch):
    def fails():
        raise PermissionError(13, "Permission denied", "/proc/meminfo")

    monkeypatch.setattr(psutil, "virtual_memory", fails)
    assert available_ram_bytes() is None


def test_the_real_machine_reports_some_free_memory():
    avail = available_ram_bytes()
    assert avail is not None and avail > 0


def test_a_context_is_refused_by_psutils_figure_and_by_the_cgroup_cap(free_memory, cgroup, model_path):
    summary = check_gguf(model_path)
    need = summary.kv_cache_bytes(4096)  # about 94 MB
    free_memory(need - 1)
    with pytest.raises(ContextTooLargeError, match="more than this machine's memory allows"):
        check_context_fits(summary, 4096)
    free_memory(4 * GiB)
    check_context_fits(summary, 4096)
    cgroup(str(need), 1)  # a container with one byte too little left
    with pytest.raises(ContextTooLargeError):
        check_context_fits(summary, 4096)


@pytest.fixture(scope="module")
def hybrid_summaries(tmp_path_factory):
    from tests.helpers.tiny_models import write_tiny_hybrid

    folder = tmp_path_factory.mktemp("hybrid-memory")
    return {arch: check_gguf(write_tiny_hybrid(arch, folder / f"{arch}.gguf", quant="f16"))
            for arch in ("lfm2", "qwen35")}


def test_a_hybrid_models_cache_counts_its_attention_layers_and_the_recurrent_states_kept_to_take_back(
    hybrid_summaries,
):
    from engine.llama.models import ROLLBACK_TOKENS
    from engine.tools.shapes import SHAPES

    for arch, summary in hybrid_summaries.items():
        shape = SHAPES[f"test-{arch}"]
        n_recurrent = shape.layers.count("r")
        # K and V (f16) of the attention layers only: Qwen3.5 gives one head count for all of its layers
        assert summary.kv_bytes_per_token == shape.layers.count("a") * shape.n_head_kv * 2 * shape.key_length * 2
        if arch == "lfm2":  # the short convolution's last inputs
            per_layer = (shape.conv_kernel - 1) * shape.n_embd
        else:  # the delta net's convolution inputs, then a state matrix per head
            conv = (2 * shape.ssm_groups + shape.ssm_heads) * shape.ssm_head_dim
            per_layer = (shape.conv_kernel - 1) * conv + shape.ssm_heads * shape.ssm_head_dim**2
        assert summary.state_bytes == n_recurrent * per_layer * 4
        assert summary.kv_cache_bytes(1000) == 1000 * summary.kv_bytes_per_token + (
            1 + ROLLBACK_TOKENS) * summary.state_bytes


def test_a_hybrid_context_is_refused_with_room_left_for_its_states(hybrid_summaries, free_memory, cgroup):
    summary = hybrid_summaries["qwen35"]
    states = summary.kv_cache_bytes(0)
    free_memory(2 * (states + 512 * summary.kv_bytes_per_token))
    with pytest.raises(ContextTooLargeError, match="at most 512 tokens"):
        # half the free memory holds the states and 512 tokens (counting the states as tokens: 2,488)
        check_context_fits(summary, 4096)
    free_memory(states)  # the states alone fill it: no context size helps
    with pytest.raises(ContextTooLargeError, match="close other programs"):
        check_context_fits(summary, 256)

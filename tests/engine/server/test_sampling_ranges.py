"""One table of sampling ranges (``SAMPLING_RANGES``): the server's request checks and the settings the app and the
command line validate take and refuse the same values, at every edge. No model is loaded."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from engine.decoding.settings import MAX_TEMPERATURE, SAMPLING_RANGES, SamplingConfig
from engine.llama.problems import SettingsError
from engine.server.requests import ApiError, parse_chat

SERVED = {f.name for f in dataclasses.fields(SamplingConfig)} - {"dry_last_n"}  # the fields a request may set
HELLO = [{"role": "user", "content": "Say hi"}]


def edges(name: str) -> list[float]:
    """Each end of ``name``'s range and the nearest values beyond it."""
    allowed = SAMPLING_RANGES[name]
    step = 1 if isinstance(getattr(SamplingConfig(), name), int) else 0.01
    return [allowed.low - step, allowed.low, allowed.high, allowed.high + step]


def one(name: str, value: float) -> dict[str, Any]:
    return {name: value}


def settings_take(name: str, value: float) -> bool:
    try:
        SamplingConfig(**one(name, value)).validate()
    except SettingsError:
        return False
    return True


def server_takes(name: str, value: float) -> bool:
    try:
        parse_chat({"messages": HELLO, name: value}, "bundled")
    except ApiError as exc:
        assert exc.param == name, exc.message  # the refusal names the field, not "sampling"
        return False
    return True


def test_every_sampling_setting_has_a_range():
    assert set(SAMPLING_RANGES) == {f.name for f in dataclasses.fields(SamplingConfig)}


@pytest.mark.parametrize("name", sorted(SERVED))
def test_the_server_and_the_settings_take_the_same_values_at_each_edge(name):
    for value in edges(name):
        expected = value in SAMPLING_RANGES[name]
        assert settings_take(name, value) == expected, value
        assert server_takes(name, value) == expected, value


def test_temperature_stops_at_openai_s_2_for_the_server_the_settings_and_the_command_line():
    assert MAX_TEMPERATURE == 2.0
    assert settings_take("temperature", 2.0) and server_takes("temperature", 2)
    assert not settings_take("temperature", 2.5) and not server_takes("temperature", 2.5)


@pytest.mark.parametrize(("name", "shown"), [
    ("temperature", "0..2"), ("top_p", "(0, 1]"), ("min_p", "[0, 1)"), ("dry_base", "(1, 4]"),
    ("seed", "0..4294967295"),
])
def test_a_range_reads_as_its_ends_with_open_ends_marked(name, shown):
    assert str(SAMPLING_RANGES[name]) == shown
    with pytest.raises(SettingsError, match=f"out of range {re.escape(shown)}$"):
        SamplingConfig(**one(name, SAMPLING_RANGES[name].high + 1)).validate()

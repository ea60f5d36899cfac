"""How the server lists the model file it serves (``ServedModel``), for the app and ``engine serve`` alike."""

from __future__ import annotations

import os
import time

import pytest

from engine.server.config import ServedModel


def test_a_served_model_is_named_by_its_file_and_dated_by_its_modification_time(tmp_path):
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(b"GGUF")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    assert ServedModel.of_file(path) == ServedModel("SmolLM2-135M-Instruct.Q4_1", 1_700_000_000)
    assert ServedModel.of_file(str(path)) == ServedModel.of_file(path)  # the same after a restart


@pytest.mark.timing
def test_a_file_that_can_no_longer_be_read_is_dated_now(tmp_path):
    before = int(time.time())
    served = ServedModel.of_file(tmp_path / "gone.gguf")
    assert served.id == "gone" and before <= served.created <= int(time.time())

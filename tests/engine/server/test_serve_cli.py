"""``python -m engine serve``: refuses an unsafe address without a key, serves, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest


def test_serving_another_address_without_a_key_is_refused():
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "needs an API key" in out.stderr


@pytest.mark.model
def test_serve_answers_and_stops_on_sigterm(model_path):
    env = {**os.environ, "LOOKAHEAD_COST_CURVE": "flat"}  # no first-use timing: only the exact-batch probe
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", str(model_path), "--port", "0", "--threads", "2",
         "--ctx", "1024", "--api-key", "test-key-1234"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stderr is not None  # stderr=PIPE
    try:
        url = None
        lines = []
        for line in proc.stderr:  # the address line comes once the port is bound
            lines.append(line)
            found = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
            if found:
                url = found.group(1)
                break
        assert url, "".join(lines)
        request = urllib.request.Request(
            f"{url}/completions", data=json.dumps({"prompt": "1, 2, 3,", "max_tokens": 6}).encode(),
            headers={"Authorization": "Bearer test-key-1234", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            body = json.loads(response.read())
        assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log = proc.stderr.read()
        assert "POST /v1/completions 200" in log
        assert "1, 2, 3," not in log, "the log never holds what was asked"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()

"""Offline and private: no socket is ever needed, and chat templates from model files run in a sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.decoding.text import ChatTemplate, Message, TemplateRenderError

ROOT = Path(__file__).resolve().parents[2]

# Model files are untrusted input: each of these must fail as TemplateRenderError, never run or leak.
ATTACKS = [
    "{{ cycler.__init__.__globals__ }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",  # one unsafe attribute is refused too, not rendered as ''
    "{{ joiner.__init__.__globals__['os'].system('id') }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",  # our own helpers expose no internals
    "{{ strftime_now.__code__ }}",
    "{{ (messages|first).__class__.__base__.__subclasses__() }}",
    "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c }}{% endfor %}",
    "{{ ''|attr('__class__') }}",
    "{{ '{0.__class__}'.format('') }}",
    "{{ self._TemplateReference__context }}",
    "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",
    "{{ messages[0].update({'role': 'system'}) }}",
    "{{ range(10**9)|list|length }}",  # the sandbox's range limit raises OverflowError
    "{% for x in x recursive %}",  # does not parse
]


@pytest.mark.parametrize("source", ATTACKS)
def test_a_chat_template_reaching_for_python_internals_fails_safely(source):
    with pytest.raises(TemplateRenderError):
        ChatTemplate(source).render([Message("user", "x")])


def test_ordinary_template_features_still_work_in_the_sandbox():
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.role | upper }}:{{ m['content'] | trim }}{% if not loop.last %}|{% endif %}{% endfor %}"
        "{% if tools is defined %}T{% endif %}{{ ' #' ~ ns.n }}{{ strftime_now('%Y')[:0] }}"
    )
    out = ChatTemplate(source).render([Message("system", " a "), Message("user", "b")])
    assert out == "SYSTEM:a|USER:b #2"


OFFLINE_RUN = r"""
import json, socket, sys

class NetworkBlocked(OSError):
    pass

def refuse(*args, **kwargs):
    raise NetworkBlocked("network access attempted: " + repr(args)[:80])

class NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        refuse(*args)

socket.socket = NoSocket
socket.create_connection = refuse
socket.socketpair = refuse
socket.getaddrinfo = refuse
socket.fromfd = refuse

from engine import ChatSession, Engine, GenerationControls, LookaheadConfig, Message, StopConfig, default_model_path

with Engine(default_model_path(), n_ctx=512, n_threads=2) as eng:
    out = {}
    for name, la in [("plain", None), ("lookahead", LookaheadConfig(window=2, ngram=3, guesses=2))]:
        eng.reset()
        events = ChatSession(eng).reply([Message("user", "Name a colour.")], GenerationControls(lookahead=la),
                                        stop=StopConfig(max_tokens=8))
        out[name] = "".join(ev.text for ev in events)
try:
    socket.socket()
except NetworkBlocked:
    out["blocked"] = True
print(json.dumps(out))
"""


@pytest.mark.model
def test_a_full_generation_runs_with_socket_creation_blocked():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", OFFLINE_RUN], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["blocked"] is True  # the block was really in place
    assert out["plain"].strip() and out["lookahead"] == out["plain"]

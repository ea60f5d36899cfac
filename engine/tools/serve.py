"""``python -m engine serve``: the model to other programs through a local OpenAI-compatible server."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from engine.decoding.runtime import Engine
from engine.decoding.settings import DEFAULT_LOOKAHEAD, LookaheadConfig
from engine.server import DEFAULT_PORT, EngineRunner, ServerConfig
from engine.server.api import ModelServer
from engine.server.config import ServedModel

API_KEY_ENV = "LOOKAHEAD_API_KEY"


def add_parser(sub: argparse._SubParsersAction, add_model_args: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("serve", help="serve the model to other programs (OpenAI-compatible API on this PC)")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this PC only; another needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on every request (or set {API_KEY_ENV})")
    p.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                   help="a web page origin allowed to call the server from a browser (repeatable; none by default)")
    p.add_argument("--lookahead", choices=["auto", "off"], default="auto",
                   help="for requests that do not choose (default auto)")


def cmd_serve(args: argparse.Namespace, open_engine: Callable[[argparse.Namespace], Engine],
              prepare_auto: Callable[[Engine, LookaheadConfig | None], None]) -> int:
    """Serve until Ctrl+C. ``open_engine`` and ``prepare_auto`` are the CLI's (model checks, Auto's curve)."""
    config = ServerConfig(
        host=args.host, port=args.port, api_key=args.api_key or os.environ.get(API_KEY_ENV, ""),
        allowed_origins=tuple(args.allow_origin), lookahead=args.lookahead,
    ).validate()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    with open_engine(args) as eng:
        if args.lookahead == "auto" and not eng.lookahead_block_reason:
            prepare_auto(eng, DEFAULT_LOOKAHEAD)
        runner = EngineRunner(eng)
        served = ServedModel.of_file(eng.summary.path)
        server = ModelServer(runner, served.id, config, created=served.created)
        try:
            server.start()
        except OSError as exc:
            runner.close()
            print(f"error: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        key_note = " (API key required)" if config.api_key else ""
        print(f"serving {served.id} at {server.base_url}{key_note}; Ctrl+C stops", file=sys.stderr, flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a service manager's stop, as Ctrl+C
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            server.stop("the server is shutting down")
            runner.close()
    return 0

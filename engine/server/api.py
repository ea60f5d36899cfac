"""A local OpenAI-compatible HTTP server for the loaded model, on aiohttp.

aiohttp because it is one well-kept library that is both the server and, in tests, a raw HTTP client; it runs
on its own asyncio loop in a thread, beside whatever owns the engine (the app's Qt worker, or ``EngineRunner``).

Safe by default: it binds 127.0.0.1; another address only with an API key. With a key, every request but
``GET /health`` must carry ``Authorization: Bearer KEY`` (or ``x-api-key: KEY``, as Anthropic's clients send
it). A request whose ``Host`` is not an address served is
refused (DNS rebinding), and so is one from a browser page whose ``Origin`` the user did not allow (no CORS
header is ever sent for it). One generation runs at a time; at most ``max_waiting`` wait; then 503. The log
holds method, path, status, tokens and time of each request, never what was asked or answered.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from engine.decoding.generation import StepEvent
from engine.server.config import ANY_ADDRESS, LOOPBACK_NAMES, ServerConfig, ServerStats, is_loopback
from engine.server.jobs import FINISHED, Job, JobRunner
from engine.server.messages import ROUTE, MessageReply, anthropic_errors, sse, to_chat_body
from engine.server.requests import ApiError, CompletionRequest, internal_error, parse_chat, parse_completion
from engine.server.responses import Reply

log = logging.getLogger("engine.server")

TOKENS = web.RequestKey("tokens", int)  # a request's generated tokens, for its log line
# How a route other than OpenAI's answers a generation: from its request, the reply, the step events and the
# time its turn came.
Answer = Callable[[web.Request, Reply, AsyncIterator[StepEvent], float], Awaitable[web.StreamResponse]]
PORT_CLOSE_WAIT_S = 0.25  # how long a stop that does not wait still waits for the port to close (a moment)


class ModelServer:
    """Serves one model through ``runner`` on ``config``'s address, from a thread of its own."""

    def __init__(self, runner: JobRunner, model_id: str, config: ServerConfig,
                 created: int | None = None, on_change: Callable[[ServerStats], None] | None = None) -> None:
        self.runner = runner
        self.model_id = model_id
        self.config = config.validate()
        self.created = int(time.time()) if created is None else created
        self.stats = ServerStats()
        self.on_change = on_change
        self.port = config.port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None  # serving
        self._ending: threading.Thread | None = None  # stopped, perhaps still sending its last answers
        self._runner: web.AppRunner | None = None
        self._shutting_down: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self._outstanding: dict[Job, asyncio.Queue[object]] = {}
        self._start_error: BaseException | None = None
        self._allowed_hosts: set[str] | None = set()

    # -- life -------------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def base_url(self) -> str:
        """What to paste into another program as the OpenAI base URL."""
        host = self.config.host
        if host in ANY_ADDRESS:
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    def start(self) -> None:
        """Listen; returns once the port is bound. Raises OSError when it cannot be (port taken, no such address)."""
        if self.running:
            return
        self.join()  # a stop that did not wait: its thread lets go of the port first
        ready = threading.Event()
        self._start_error = None
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="model-server", daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            self._thread.join()
            self._thread = None
            raise self._start_error

    def stop(self, message: str = "the server was stopped", wait: bool = True) -> None:
        """Close the port, answer every waiting or running request with ``message`` (503) and end the thread.

        ``wait=False`` returns once the port is closed, which the server's loop does first, at once: a window's
        thread must not wait on clients. The thread then sends the answers and ends on its own; ``join`` waits
        for that, and ``start`` does before it listens again.
        """
        thread, loop, self._thread = self._thread, self._loop, None
        if thread is None or loop is None:
            return
        self._ending = thread
        port_closed = threading.Event()
        try:
            loop.call_soon_threadsafe(self._begin_shutdown, message, port_closed)
        except RuntimeError:  # its loop has closed already: nothing is left to answer
            port_closed.set()
        if wait:
            self.join()
        else:
            port_closed.wait(PORT_CLOSE_WAIT_S)

    def join(self, timeout: float = 15.0) -> None:
        """Wait, at most ``timeout`` s, until the thread of the last ``stop`` has ended (every answer sent)."""
        thread = self._ending
        if thread is not None:
            thread.join(timeout)
            if not thread.is_alive():
                self._ending = None

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            runner = web.AppRunner(self._make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.config.host, self.config.port)
            loop.run_until_complete(site.start())
            self._runner = runner
            self.port = runner.addresses[0][1]
            self._allowed_hosts = self._hosts_allowed()
        except BaseException as exc:
            self._start_error = exc
            loop.close()
            ready.set()
            return
        log.info("serving %s on %s", self.model_id, self.base_url)
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()
            log.info("server stopped")

    def _begin_shutdown(self, message: str, port_closed: threading.Event) -> None:  # on the loop
        self._shutting_down = asyncio.ensure_future(self._shutdown(message, port_closed))

    async def _shutdown(self, message: str, port_closed: threading.Event) -> None:
        """Close the port; answer what waits or runs with ``message`` and give the handlers a second to send it;
        close the connections (the handlers still going are cancelled after ``shutdown_timeout``); end the loop."""
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                for site in list(runner.sites):
                    await site.stop()  # no new connection from here on
            port_closed.set()
            for job, events in list(self._outstanding.items()):
                job.cancel.set()
                events.put_nowait(ApiError(503, message, "server_stopped", kind="server_error"))
            for _ in range(50):  # let the handlers answer
                if not self._outstanding:
                    break
                await asyncio.sleep(0.02)
            if runner is not None:
                await runner.cleanup()
        finally:
            asyncio.get_running_loop().stop()

    def _hosts_allowed(self) -> set[str] | None:
        """The Host header values a request may carry (None: any, when serving every address with a key)."""
        host, port = self.config.host, self.port
        if host in ANY_ADDRESS:
            return None
        names = set(LOOPBACK_NAMES) if is_loopback(host) else {f"[{host}]" if ":" in host else host}
        return {n.lower() for n in names} | {f"{n}:{port}".lower() for n in names}

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.stats)
            except Exception:
                log.exception("server status listener")

    # -- HTTP -------------------------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=[self._errors, anthropic_errors, self._guard])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post(ROUTE, self._messages)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        """Every refusal as OpenAI's error object; one log line per request, without its text."""
        start = time.perf_counter()
        response: web.StreamResponse
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _error_response(exc)
        except web.HTTPException as exc:
            response = _error_response(_from_http(exc))
        except (ConnectionResetError, asyncio.CancelledError):
            log.info("%s %s client gone after %.2f s, %d tokens", request.method, request.path,
                     time.perf_counter() - start, request.get(TOKENS, 0))
            raise
        except Exception:  # a fault of ours: the traceback goes to the log, never to the client
            log.exception("%s %s failed", request.method, request.path)
            response = _error_response(internal_error())
        if not response.prepared:  # a stream has sent its headers already
            response.headers.update(self._cors(request))
        if response.status >= 400:
            self.stats.refused += 1
            self._changed()
        log.info("%s %s %d %d tokens %.2f s", request.method, request.path, response.status,
                 request.get(TOKENS, 0), time.perf_counter() - start)
        return response

    def _cors(self, request: web.Request) -> dict[str, str]:
        """The CORS headers of an answer to a page the user allowed (none for any other request)."""
        origin = request.headers.get("Origin")
        if origin is None or origin not in self.config.allowed_origins:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
        """Host, Origin (CORS) and API key, before anything is read."""
        allowed = self._allowed_hosts
        host = request.headers.get("Host", "").lower()
        if allowed is not None and host not in allowed:
            raise ApiError(403, f"Host {host!r} is not an address this server serves", "forbidden_host",
                           kind="permission_error")
        origin = request.headers.get("Origin")
        if origin is not None:  # a browser page: only one the user allowed (_errors adds the CORS headers)
            if origin not in self.config.allowed_origins:
                raise ApiError(403, f"requests from the web page {origin!r} are not allowed", "forbidden_origin",
                               kind="permission_error")
            if request.method == "OPTIONS":
                return web.Response(status=204, headers={
                    "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                    "Access-Control-Allow-Headers": "Authorization, Content-Type", "Access-Control-Max-Age": "600"})
        if self.config.api_key and request.path != "/health":
            key = self.config.api_key.encode("utf-8")
            bearer = request.headers.get("Authorization", "").encode("utf-8", "replace")
            x_api_key = request.headers.get("X-Api-Key", "").encode("utf-8", "replace")  # Anthropic's clients'
            # both compared whatever the first gives (``|``, not ``or``): the time taken tells nothing of the key
            if not (hmac.compare_digest(bearer, b"Bearer " + key) | hmac.compare_digest(x_api_key, key)):
                raise ApiError(401, "a valid API key is required: send Authorization: Bearer KEY (or x-api-key: KEY)",
                               "invalid_api_key", kind="authentication_error")
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": self.model_id})

    def _model_object(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "local"}

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_object()]})

    async def _model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.model_id:
            raise ApiError(404, f"model {request.match_info['model']!r} is not served here", "model_not_found",
                           "model", kind="not_found_error")
        return web.json_response(self._model_object())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request, self.config.max_body_bytes)
        return await self._generate(request, parse_chat(body, self.model_id, self.config.lookahead), chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request, self.config.max_body_bytes)
        return await self._generate(request, parse_completion(body, self.model_id, self.config.lookahead), chat=False)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API: its body read as a chat's, its reply told as Anthropic's message (refusals
        take Anthropic's shape in ``anthropic_errors``)."""
        body = await _json_body(request, self.config.max_body_bytes)
        req = parse_chat(to_chat_body(body), self.model_id, self.config.lookahead)
        return await self._generate(request, req, chat=True, answer=self._answer_message)

    async def _answer_message(self, request: web.Request, reply: Reply, steps: AsyncIterator[StepEvent],
                              started: float) -> web.StreamResponse:
        message = MessageReply(reply)
        if not reply.request.stream:
            async for _ in steps:
                pass
            whole = web.json_response(message.whole())
            self._served(reply, started)
            return whole
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no", **self._cors(request)})
        await response.prepare(request)
        try:
            async for event in steps:
                await response.write(sse(message.step(event)))
            await response.write(sse(message.finish()))
            self._served(reply, started)
        except ApiError as exc:  # the status is sent already: the error goes in the stream
            await response.write(sse(message.error(exc)))
        except ConnectionResetError:
            raise
        except Exception:  # a fault of ours after the headers went: said in the stream, without its text
            log.exception("%s %s failed mid-stream", request.method, request.path)
            await response.write(sse(message.error(internal_error())))
        await response.write_eof()
        return response

    # -- generation -------------------------------------------------------------------------------------------

    async def _generate(self, request: web.Request, req: CompletionRequest, chat: bool,
                        answer: Answer | None = None) -> web.StreamResponse:
        waiting = self._waiting()
        if self._outstanding and waiting >= self.config.max_waiting:
            recent = self.stats.history[-8:] or [10.0]
            retry = min(600, max(1, math.ceil(sum(recent) / len(recent) * (waiting + 1))))
            raise ApiError(503, f"the server is busy: {waiting} requests are waiting; try again later",
                           "queue_full", kind="server_error", headers={"Retry-After": str(retry)})
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[object] = asyncio.Queue()

        def sink(item: object) -> None:  # called on the engine's thread
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the server has stopped (its loop is closed): no one waits for this job now
                pass

        job = Job(req, sink)
        self._outstanding[job] = events
        self._count()
        reply = Reply(req, chat, self.model_id)
        try:
            self.runner.submit(job)
            first = await events.get()
            started = time.perf_counter()  # its turn came: what it takes from here is what the next one waits
            self._count()
            if isinstance(first, ApiError):
                raise first
            steps = self._steps(request, reply, first, events)
            if answer is not None:
                return await answer(request, reply, steps, started)
            if req.stream:
                return await self._stream(request, reply, steps, started)
            async for _ in steps:
                pass
            self._served(reply, started)
            return web.json_response(reply.whole())
        finally:
            job.cancel.set()  # done, failed, or the client went away: the job stops within a step
            self._outstanding.pop(job, None)
            self._count()

    def _waiting(self) -> int:
        """Requests accepted whose generation has not started yet."""
        return sum(not job.started.is_set() for job in self._outstanding)

    def _count(self) -> None:
        self.stats.waiting = self._waiting()
        self.stats.running = any(job.started.is_set() for job in self._outstanding)
        self._changed()

    @staticmethod
    async def _steps(request: web.Request, reply: Reply, first: object,
                     events: asyncio.Queue[object]) -> AsyncIterator[StepEvent]:
        """The generation's step events as they come, each folded into ``reply`` first; ends when the generation
        does, raises its ``ApiError`` if it fails."""
        item = first
        while item is not FINISHED:
            if isinstance(item, ApiError):
                raise item
            event = cast(StepEvent, item)
            reply.observe(event)
            request[TOKENS] = reply.stats.n_tokens
            yield event
            item = await events.get()

    async def _stream(self, request: web.Request, reply: Reply, steps: AsyncIterator[StepEvent],
                      started: float) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no", **self._cors(request)})
        await response.prepare(request)  # the headers go before the stream's first byte

        async def send(obj: dict[str, Any]) -> None:
            await response.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n")

        try:
            await send(reply.chunk(role=True))
            async for event in steps:
                for chunk in reply.text_chunks(event.text):
                    await send(chunk)
            for chunk in reply.closing_chunks():
                await send(chunk)
            await send(reply.chunk(finish=True))
            if reply.request.include_usage:
                await send(reply.usage_chunk())
            self._served(reply, started)
        except ApiError as exc:  # the status is sent already: the error goes in the stream
            await send(exc.body())
        except ConnectionResetError:  # the client went away: there is no one to tell
            raise
        except Exception:  # a fault of ours after the headers went: said in the stream, without its text
            log.exception("%s %s failed mid-stream", request.method, request.path)
            await send(internal_error().body())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _served(self, reply: Reply, started: float) -> None:
        s = reply.stats
        self.stats.served += 1
        self.stats.last_tokens = s.n_tokens
        self.stats.last_tokens_per_s = s.tokens_per_s
        self.stats.last_tokens_per_step = s.tokens_per_step
        self.stats.last_lookahead = reply.request.lookahead_asked
        self.stats.last_elapsed_s = time.perf_counter() - started
        self.stats.history = [*self.stats.history[-15:], self.stats.last_elapsed_s]


async def _json_body(request: web.Request, limit: int) -> Any:
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, f"the request body is {length} bytes; at most {limit} are taken", "request_too_large")
    raw = await request.read()  # aiohttp refuses a body past ``limit`` sent without a length (413)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, nested too deep, a number too long
        raise ApiError(400, f"the request body is not valid JSON: {exc}", "invalid_json") from None


def _error_response(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


def _from_http(exc: web.HTTPException) -> ApiError:
    """aiohttp's own refusals (unknown path, wrong method, body too large) as OpenAI errors."""
    codes = {404: ("not_found", "not_found_error", "no such endpoint"),
             405: ("method_not_allowed", "invalid_request_error", "this endpoint does not take that method"),
             413: ("request_too_large", "invalid_request_error", "the request body is too large")}
    code, kind, message = codes.get(exc.status, ("http_error", "invalid_request_error", exc.reason))
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    return ApiError(exc.status, message, code, kind=kind, headers=headers)

"""`dlm-lsp http`: an OpenAI-compatible `POST /v1/completions` endpoint for Zed.

Zed's `open_ai_compatible_api` edit-prediction provider posts
`{model, prompt, max_tokens, stop}` and reads `choices[0].text`. This module is
the HTTP side: it validates the request, reads the prompt with
lsp.zed_prompts (Zed's fill-in-the-middle and zeta formats), has the engine
predict the new region, and answers in the request's format. Zed sends a
request per keystroke: a newer request for the same file cancels the one
still running (latest wins).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dlm.coder_model.remote.auth import is_loopback_host
from dlm.coder_model.remote.client import parse_host_port
from dlm.coder_model.types import CancelToken, SamplerParams
from dlm.lsp import gate
from dlm.lsp.engine_holder import EngineHolder, make_engine_factory
from dlm.lsp.options import Options
from dlm.lsp.zed_prompts import PromptFormatError, build_prompt, parse_prompt, render_answer

log = logging.getLogger("dlm.http")

@dataclass
class EndpointOptions:
    zeta_lines_before: int = 1  # zeta: region = cursor line and this many lines before it...
    zeta_lines_after: int = 1  # ...and after it, inside Zed's editable region
    sampler: dict[str, Any] = field(default_factory=dict)  # SamplerParams overrides
    max_prompt_chars: int = 1_000_000  # larger bodies are refused (Zed sends ~a few KB)
    load_timeout_s: float = 600.0  # a request waits this long for the model to load
    # Answer within this long of the request's arrival, or answer nothing (lsp.gate): Zed
    # sends a request per keystroke pause and drops late ones anyway.
    deadline_ms: int = 250
    min_confidence: float = Options.min_confidence  # the LSP's confidence gate, same default


# -- the HTTP server ---------------------------------------------------------------


class RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def parse_request(body: bytes, max_chars: int) -> dict:
    """Validate a /v1/completions body; RequestError (400) with what is wrong otherwise."""
    if len(body) > max_chars * 4:
        raise RequestError(413, f"request body of {len(body)} bytes is over the limit; send a smaller prompt")
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, f"the body is not JSON ({exc}); send {{\"model\", \"prompt\", ...}}") from None
    if not isinstance(req, dict):
        raise RequestError(400, "the body must be a JSON object with 'prompt'")
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise RequestError(400, "'prompt' must be a string (one prompt per request)")
    if len(prompt) > max_chars:
        raise RequestError(413, f"'prompt' has {len(prompt)} characters, over the {max_chars} limit")
    stop = req.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise RequestError(400, "'stop' must be a string or a list of strings")
    max_tokens = req.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {max_tokens!r}")
    model = req.get("model", "")
    return {"prompt": prompt, "stop": stop, "max_tokens": max_tokens, "model": model if isinstance(model, str) else ""}


class Predictor:
    """Parse -> predict -> render, with latest-wins cancellation per file."""

    def __init__(self, holder: EngineHolder, opts: EndpointOptions):
        self.holder = holder
        self.opts = opts
        self.params = SamplerParams(**opts.sampler)
        self._lock = threading.Lock()
        self._inflight: dict[str, CancelToken] = {}

    def engine(self):
        """The loaded engine; RequestError 503 (with the reason) while loading or after a failed load."""
        engine = self.holder.wait_loaded(self.opts.load_timeout_s)
        if engine is not None:
            return engine
        if self.holder.error:
            raise RequestError(503, self.holder.error, "server_error")
        raise RequestError(503, "the model is still loading; retry in a few seconds", "server_error")

    def complete(self, req: dict) -> dict:
        deadline = time.monotonic() + self.opts.deadline_ms / 1000.0  # from the request's arrival
        try:
            zp = parse_prompt(req["prompt"])
        except PromptFormatError as exc:
            raise RequestError(400, str(exc)) from None
        built = build_prompt(zp, self.opts.zeta_lines_before, self.opts.zeta_lines_after)
        engine = self.engine()
        key = zp.path or "<untitled>"
        cancel = CancelToken()
        with self._lock:
            old = self._inflight.get(key)
            if old is not None:
                old.cancel()  # Zed has moved on: a newer keystroke in the same file
            self._inflight[key] = cancel
        t0 = time.perf_counter()
        try:
            pred = engine.predict(built.prompt, self.params, cancel, deadline)
        finally:
            with self._lock:
                if self._inflight.get(key) is cancel:
                    del self._inflight[key]
        verdict = gate.decide(pred.confidence, False, pred.late or time.monotonic() > deadline,
                              self.opts.min_confidence, 1.0)
        text = "" if pred.cancelled or not verdict.show else render_answer(zp, built, pred.text, req["stop"])
        log.info(
            "%s %s: %.0f ms, %d steps, %d tokens, confidence %s%s",
            zp.format, key, (time.perf_counter() - t0) * 1000, pred.steps, pred.tokens, pred.confidence,
            " (cancelled)" if pred.cancelled else "" if verdict.show else f" (not shown: {verdict.reason})",
        )  # fmt: skip
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req["model"] or "dlm",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
            "usage": {
                "prompt_tokens": pred.context_tokens,
                "completion_tokens": pred.tokens,
                "total_tokens": pred.context_tokens + pred.tokens,
            },
        }


def make_server(host: str, port: int, predictor: Predictor) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "dlm-lsp-http"

        def log_message(self, fmt: str, *args) -> None:  # route to logging, not stderr
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, exc: RequestError) -> None:
            self._send(exc.status, {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}})

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/health", "/v1/health"):
                h = predictor.holder
                state = "failed" if h.error else ("ready" if h.engine is not None else "loading")
                self._send(200, {"status": state, "message": h.error})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "dlm", "object": "model", "owned_by": "dlm-lsp"}]})
            else:
                self._error(RequestError(404, f"no GET {path}; POST /v1/completions", "not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                if path not in ("/v1/completions", "/completions"):
                    raise RequestError(404, f"no POST {path}; the endpoint is /v1/completions", "not_found")
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    raise RequestError(400, "Content-Length is not a number") from None
                if n <= 0:
                    raise RequestError(400, "empty body; send a JSON object with 'prompt'")
                limit = predictor.opts.max_prompt_chars * 4
                if n > limit:
                    raise RequestError(413, f"request body of {n} bytes is over the {limit}-byte limit")
                req = parse_request(self.rfile.read(n), predictor.opts.max_prompt_chars)
                self._send(200, predictor.complete(req))
            except RequestError as exc:
                self._error(exc)
            except Exception as exc:
                log.exception("request failed")
                self._error(RequestError(500, f"prediction failed: {exc}; see the dlm-lsp http log", "server_error"))

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


# -- CLI -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8765", help="HOST:PORT to serve on (default 127.0.0.1:8765)")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the model runs")
    parser.add_argument("--remote", default=None, help="HOST:PORT of a `dlm-lsp serve` GPU box instead of a local model")
    parser.add_argument("--token-file", default=None, help="shared token for --remote (or DLM_TOKEN)")
    parser.add_argument("--tls", action="store_true", help="use TLS to the --remote server")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR, any case (default INFO)")
    parser.add_argument("--deadline-ms", type=int, default=EndpointOptions.deadline_ms,
                        help="answer within this many ms of a request, or answer nothing (default %(default)s)")
    parser.add_argument("--min-confidence", type=float, default=EndpointOptions.min_confidence,
                        help="answer only suggestions at this calibrated confidence or above (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    try:
        host, port = parse_host_port(args.listen, default_port=None)
    except ValueError as exc:
        print(f"dlm-lsp http: --listen {exc}; use e.g. --listen 127.0.0.1:8765", file=sys.stderr)
        return 2
    if not is_loopback_host(host):
        # The endpoint has no authentication: anyone who can reach it reads your code's completions.
        log.warning("listening on %s, which is not a loopback address: the endpoint has no authentication", host)
    if args.deadline_ms < 1 or not 0 <= args.min_confidence <= 1:
        print("dlm-lsp http: --deadline-ms must be >= 1 and --min-confidence in [0, 1]", file=sys.stderr)
        return 2
    holder = EngineHolder(make_engine_factory(args))
    predictor = Predictor(holder, EndpointOptions(deadline_ms=args.deadline_ms, min_confidence=args.min_confidence))
    try:
        server = make_server(host, port, predictor)
    except OSError as exc:
        print(f"dlm-lsp http: cannot listen on {host}:{port} ({exc}); pick another --listen port", file=sys.stderr)
        return 2
    holder.start()
    h, p = server.server_address[:2]
    print(f"dlm-lsp http: listening on http://{h}:{p}/v1/completions", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        holder.close()
    return 0

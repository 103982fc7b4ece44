"""`dlm-lsp http`: an OpenAI-compatible `POST /v1/completions` endpoint for Zed.

Zed shows edit predictions only from its own providers, one of which,
`open_ai_compatible_api`, posts `{model, prompt, max_tokens, stop}` to a URL
and reads `choices[0].text`. The prompt is a string Zed formats itself, in
one of two families (Zed's crates/edit_prediction, fim.rs and zeta1):

- fill-in-the-middle (`prompt_format` code_llama, star_coder, deepseek_coder,
  qwen, codegemma, codestral, glm): the text before and after the cursor of a
  ~512-token window; Zed inserts the answer at the cursor;
- zeta (`prompt_format: "zeta"`): an instruction, the user's recent edits as
  diffs, and an excerpt with `<|editable_region_start|>`, the cursor marker
  `<|user_cursor_is_here|>` and `<|editable_region_end|>`; Zed replaces the
  editable region with the answer (text after `<|editable_region_start|>\\n`)
  and shows the difference as edits anywhere in the region.

Each request is parsed back into a `Prompt` (region = the cursor line, plus a
line either side for zeta, so the masked block stays short), the engine
predicts the new region, and the answer is rendered in the request's format.
Zed sends a request per keystroke: a newer request for the same file cancels
the one still running (latest wins).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dlm.coder_model.types import CancelToken, Prompt, SamplerParams

log = logging.getLogger("dlm.http")

# -- Zed's prompt formats ------------------------------------------------------

CURSOR = "<|user_cursor_is_here|>"
START_OF_FILE = "<|start_of_file|>"
REGION_START = "<|editable_region_start|>"
REGION_END = "<|editable_region_end|>"
ZETA_EXCERPT_HEADER = "\n\n### User Excerpt:\n\n"
ZETA_EDITS_HEADER = "### User Edits:\n\n"
ZETA_RESPONSE_HEADER = "\n\n### Response:\n"

# name -> (opening, middle, closing) markers; the text between opening and
# middle is the prefix, between middle and closing the suffix (codestral: reversed).
FIM_FORMATS: dict[str, tuple[str, str, str]] = {
    "code_llama": ("<PRE> ", " <SUF>", " <MID>"),
    "star_coder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    "deepseek_coder": ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # also codegemma
    "glm": ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),
}
CODESTRAL = ("[SUFFIX]", "[PREFIX]")  # "[SUFFIX]{suffix}[PREFIX]{prefix}"

SUPPORTED = "code_llama, star_coder, deepseek_coder, qwen, codegemma, codestral, glm, zeta"


class PromptFormatError(ValueError):
    """The prompt is in no format we can read; the message says what to set in Zed."""


@dataclass(frozen=True)
class ZedPrompt:
    """What a Zed prompt says: an excerpt of the file and where the cursor is in it.

    `text` is the excerpt without markers, `cursor` an offset in it, and
    `editable` the (start, end) offsets Zed lets the answer rewrite (zeta), or
    the whole excerpt (fill-in-the-middle, where the answer is an insertion).
    """

    format: str
    text: str
    cursor: int
    editable: tuple[int, int]
    history: tuple[str, ...] = ()
    path: str = ""
    start_of_file: bool = False


def parse_prompt(prompt: str) -> ZedPrompt:
    """A Zed edit-prediction prompt -> ZedPrompt; PromptFormatError if it is in no known format."""
    if not isinstance(prompt, str):
        raise PromptFormatError(f"'prompt' must be a string, got {type(prompt).__name__}")
    if REGION_START in prompt and CURSOR in prompt:
        return _parse_zeta(prompt)
    for name, (a, b, c) in FIM_FORMATS.items():
        if prompt.startswith(a) and prompt.endswith(c) and b in prompt[len(a) : len(prompt) - len(c)]:
            body = prompt[len(a) : len(prompt) - len(c)]
            prefix, _, suffix = body.partition(b)
            return _fim(name, prefix, suffix)
    s, p = CODESTRAL
    if prompt.startswith(s) and p in prompt[len(s) :]:
        suffix, _, prefix = prompt[len(s) :].partition(p)
        return _fim("codestral", prefix, suffix)
    raise PromptFormatError(
        "the prompt is in none of the formats dlm-lsp reads (" + SUPPORTED + "); in Zed's settings set "
        '"edit_predictions": {"open_ai_compatible_api": {"prompt_format": "qwen"}} (or "zeta")'
    )


def _fim(name: str, prefix: str, suffix: str) -> ZedPrompt:
    text = prefix + suffix
    return ZedPrompt(format=name, text=text, cursor=len(prefix), editable=(0, len(text)))


def _parse_zeta(prompt: str) -> ZedPrompt:
    """Zeta (v1) prompt: instruction, '### User Edits:' diffs, '### User Excerpt:' block, '### Response:'."""
    rs = prompt.find(REGION_START)
    hdr = prompt.rfind(ZETA_EXCERPT_HEADER, 0, rs)
    if hdr < 0:
        raise PromptFormatError(
            "zeta prompt without '### User Excerpt:' before <|editable_region_start|>; "
            'this is not the zeta format Zed sends, set "prompt_format": "zeta" or "qwen"'
        )
    end = prompt.rfind(ZETA_RESPONSE_HEADER)
    if end < rs:
        end = len(prompt)
    excerpt = prompt[hdr + len(ZETA_EXCERPT_HEADER) : end]
    excerpt = excerpt.removesuffix("\n```")
    path = ""
    if excerpt.startswith("```"):
        first, _, excerpt = excerpt.partition("\n")
        path = first[3:].strip()
    sof = excerpt.startswith(START_OF_FILE + "\n")
    if sof:
        excerpt = excerpt[len(START_OF_FILE) + 1 :]
    before, _, rest = excerpt.partition(REGION_START)
    rest = rest.removeprefix("\n")
    editable, found_end, after = rest.partition(REGION_END)
    if not found_end:
        raise PromptFormatError("zeta prompt has <|editable_region_start|> but no <|editable_region_end|>")
    editable = editable.removesuffix("\n")
    if editable.count(CURSOR) != 1:
        raise PromptFormatError(
            f"zeta prompt has {editable.count(CURSOR)} cursor markers in the editable region; expected 1"
        )
    ed_before, _, ed_after = editable.partition(CURSOR)
    edits_at = prompt.find(ZETA_EDITS_HEADER)
    events = prompt[edits_at + len(ZETA_EDITS_HEADER) : hdr] if 0 <= edits_at < hdr else ""
    text = before + ed_before + ed_after + after
    start = len(before)
    return ZedPrompt(
        format="zeta",
        text=text,
        cursor=start + len(ed_before),
        editable=(start, start + len(ed_before) + len(ed_after)),
        history=parse_zeta_events(events),
        path=path,
        start_of_file=sof,
    )


def parse_zeta_events(events: str) -> tuple[str, ...]:
    """'User edited PATH:\\n```diff\\nHUNKS\\n```' blocks (oldest first) -> unified diffs as lsp.history renders them."""
    out: list[str] = []
    for block in events.split("User edited ")[1:]:
        head, sep, rest = block.partition(":\n```diff\n")
        if not sep:
            continue
        body, _, _ = rest.rpartition("\n```")
        body = body.strip("\n")
        if body:
            name = head.strip().strip('"') or "untitled"
            out.append(f"--- a/{name}\n+++ b/{name}\n{body}\n")
    return tuple(out)


# -- ZedPrompt <-> Prompt ----------------------------------------------------------


@dataclass
class EndpointOptions:
    zeta_lines_before: int = 1  # zeta: region = cursor line and this many lines before it...
    zeta_lines_after: int = 1  # ...and after it, inside Zed's editable region
    sampler: dict[str, Any] = field(default_factory=dict)  # SamplerParams overrides
    max_prompt_chars: int = 1_000_000  # larger bodies are refused (Zed sends ~a few KB)


@dataclass(frozen=True)
class Built:
    prompt: Prompt
    region_start: int  # offsets of the region in ZedPrompt.text
    region_end: int


def _line_start(text: str, pos: int, lo: int) -> int:
    i = text.rfind("\n", lo, pos)
    return lo if i < 0 else i + 1


def _line_end(text: str, pos: int, hi: int) -> int:
    i = text.find("\n", pos, hi)
    return hi if i < 0 else i


def build_prompt(zp: ZedPrompt, opts: EndpointOptions | None = None) -> Built:
    """The engine's Prompt for a parsed Zed prompt: the region is the cursor line (fim) or
    the cursor line with a line either side (zeta), clipped to Zed's editable range."""
    opts = opts or EndpointOptions()
    lo, hi = zp.editable
    t = zp.text
    s = _line_start(t, zp.cursor, lo)
    e = _line_end(t, zp.cursor, hi)
    if zp.format == "zeta":
        for _ in range(opts.zeta_lines_before):
            if s > lo:
                s = _line_start(t, s - 1, lo)
        for _ in range(opts.zeta_lines_after):
            if e < hi:
                e = _line_end(t, e + 1, hi)
    prompt = Prompt(
        prefix=t[:s],
        region=t[s:e],
        cursor=zp.cursor - s,
        suffix=t[e:],
        history=zp.history,
        language=_language(zp.path),
        path=zp.path,
    )
    return Built(prompt, s, e)


_EXT_LANG = {
    "py": "python", "js": "javascript", "jsx": "javascript", "ts": "typescript", "tsx": "typescript",
    "rs": "rust", "go": "go", "c": "c", "h": "c", "cc": "cpp", "cpp": "cpp", "hpp": "cpp", "java": "java",
    "lua": "lua", "rb": "ruby", "sh": "shell",
}  # fmt: skip


def _language(path: str) -> str:
    ext = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    return _EXT_LANG.get(ext, "")


def _cut_at_stop(text: str, stop: list[str]) -> str:
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


def render_answer(zp: ZedPrompt, built: Built, new_region: str, stop: list[str]) -> str:
    """The completion text Zed expects for the model's new region."""
    from dlm.lsp.postprocess import suggest

    p = built.prompt
    if zp.format == "zeta":
        lo, hi = zp.editable
        new_editable = zp.text[lo : built.region_start] + new_region + zp.text[built.region_end : hi]
        # Zed keeps the text after "<|editable_region_start|>\n" (up to the end marker, which a
        # server would have stopped at), so nothing follows the new editable text. The stop
        # strings are not applied: cutting the region short would delete the rest of it.
        return REGION_START + "\n" + new_editable
    # Fill-in-the-middle: Zed inserts the answer at the cursor, so only an insertion can be shown.
    sug = suggest(p.region, p.cursor, new_region, p.suffix)
    if sug.replace_end is not None:
        return ""
    return _cut_at_stop(sug.insert_text, stop)


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


class EngineHolder:
    """Loads the engine once, in the background, and hands it to requests when ready."""

    def __init__(self, factory: Callable[[], Any], load_timeout_s: float = 600.0):
        self._factory = factory
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self.engine: Any = None
        self.error = ""
        self.load_timeout_s = load_timeout_s

    def start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._load, name="dlm-http-load", daemon=True).start()

    def _load(self) -> None:
        try:
            self.engine = self._factory()
        except Exception as exc:
            log.exception("loading the model failed")
            self.error = f"loading the model failed: {exc}"
        finally:
            self._ready.set()

    def get(self):
        self.start()
        if not self._ready.wait(self.load_timeout_s):
            raise RequestError(503, "the model is still loading; retry in a few seconds", "server_error")
        if self.engine is None:
            raise RequestError(503, self.error + "; fix the --model/--remote option and restart", "server_error")
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class Predictor:
    """Parse -> predict -> render, with latest-wins cancellation per file."""

    def __init__(self, holder: EngineHolder, opts: EndpointOptions):
        self.holder = holder
        self.opts = opts
        self.params = SamplerParams(**opts.sampler)
        self._lock = threading.Lock()
        self._inflight: dict[str, CancelToken] = {}

    def complete(self, req: dict) -> dict:
        try:
            zp = parse_prompt(req["prompt"])
        except PromptFormatError as exc:
            raise RequestError(400, str(exc)) from None
        built = build_prompt(zp, self.opts)
        engine = self.holder.get()
        key = zp.path or "<untitled>"
        cancel = CancelToken()
        with self._lock:
            old = self._inflight.get(key)
            if old is not None:
                old.cancel()  # Zed has moved on: a newer keystroke in the same file
            self._inflight[key] = cancel
        t0 = time.perf_counter()
        try:
            pred = engine.predict(built.prompt, self.params, cancel)
        finally:
            with self._lock:
                if self._inflight.get(key) is cancel:
                    del self._inflight[key]
        text = "" if pred.cancelled else render_answer(zp, built, pred.text, req["stop"])
        log.info(
            "%s %s: %.0f ms, %d steps, %d tokens%s",
            zp.format, key, (time.perf_counter() - t0) * 1000, pred.steps, pred.tokens,
            " (cancelled)" if pred.cancelled else "",
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
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SystemExit(f"dlm-lsp http: --listen {text!r} is not HOST:PORT; use e.g. --listen 127.0.0.1:8765")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    host, port = parse_listen(args.listen)
    from dlm.coder_model.remote.auth import is_loopback_host

    if not is_loopback_host(host):
        # The endpoint has no authentication: anyone who can reach it reads your code's completions.
        log.warning("listening on %s, which is not a loopback address: the endpoint has no authentication", host)
    from dlm.lsp.server import make_engine_factory

    holder = EngineHolder(make_engine_factory(args))
    predictor = Predictor(holder, EndpointOptions())
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

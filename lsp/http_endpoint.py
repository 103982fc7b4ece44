"""`dlm-lsp http`: an OpenAI-compatible `POST /v1/completions` endpoint for Zed.

Zed's `open_ai_compatible_api` edit-prediction provider posts
`{model, prompt, max_tokens, stop}` and reads `choices[0].text`. This module is
the HTTP side: it validates the request, reads the prompt with
lsp.zed_prompts (Zed's fill-in-the-middle and zeta formats), has the engine
predict the new region, and answers in the request's format. Zed sends a
request per keystroke: a newer request for the same file cancels the one
still running (latest wins).

A request with OpenAI's `suffix` field is a fill in the middle (`prompt` before the cursor,
`suffix` after it), as vLLM and SGLang take it and as the language server's `openai-fim` engine
sends it (coder_model.hosted, docs/engines.md): the answer is the text to insert, written in the
language server's typing mode (the region: the cursor line and the rest of its statement), and
the commented file headers the engine puts before the prefix (`# Path: P`,
coder_model.hosted.prompts.file_headers) name the file and carry the repository memory's
snippets. The engine, having read `owned_by: dlm-lsp` in /v1/models, also sends the `dlm` field:
the editable region's extent, the language and the mode, so the model gets exactly the prompt the
language server would have given it embedded.

With `--workspace DIR` the endpoint also has the repository memory of DIR: the
language server's indexer (lsp.workspace_index: the same walk, ignore rules, secret
filter and on-disk cache) indexes it, and a typing request (a fill-in-the-middle
or plain prompt, or a zeta prompt whose cursor is at a completion point) gets the
memory's proposals at the cursor, checked by the denoiser, as the language
server's typing mode does. The prompt's text is the current document; the path
Zed names in it only selects which indexed file that is (`FolderIndex.current`):
the endpoint never opens a file a prompt names, and a path outside DIR or not
indexed gets no memory (the model answers alone). Serving a workspace needs a
token even on loopback: any local user could otherwise read the indexed code
through it.

Security (docs/remote.md, "Security of the endpoint"): a web page in the developer's browser
can reach a local port, so requests carrying an `Origin` header (browsers
send one on every cross-origin POST and fetch; Zed does not) are refused,
the `Host` must name the listen address or localhost (DNS rebinding), and a
POST must be `Content-Type: application/json` (a form post cannot be).
With a token (--token-file or DLM_TOKEN; required off loopback) every
request needs `Authorization: Bearer TOKEN`. Slow clients are bounded: the
request headers and the body each have a deadline, and connections beyond
`max_connections` get 503.
"""

from __future__ import annotations

import argparse
import bisect
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dlm.coder_model import budget as budget_rules
from dlm.coder_model import limits, regions, secrets
from dlm.coder_model.devices import add_device_argument
from dlm.coder_model.hosted.prompts import DLM_FIELD, read_file_headers
from dlm.coder_model.languages import language_for_path
from dlm.coder_model.limits import MAX_PATH_CHARS
from dlm.coder_model.remote.auth import AuthConfigError, check_bind_allowed, load_token
from dlm.coder_model.remote.client import parse_host_port
from dlm.coder_model.types import CancelToken, LayoutBudget, Prompt, SamplerParams
from dlm.lsp import context, discovery, gate, postprocess, syntax_check
from dlm.lsp.cli import expand_path
from dlm.lsp.engine_holder import EngineHolder, make_engine_factory
from dlm.lsp.options import IndexOptions, Options
from dlm.lsp.workspace_index import WorkspaceIndex
from dlm.lsp.zed_prompts import (
    SUFFIX_FORMAT,
    Built,
    PromptFormatError,
    ZedPrompt,
    build_prompt,
    cursor_line,
    parse_prompt,
    render_answer,
)

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
    deadline_ms: int = limits.DEFAULT_DEADLINE_MS
    min_confidence: float = Options.min_confidence  # the LSP's confidence gate, same default
    # Slow clients (slowloris): the request line and headers, then the body, must arrive within
    # these; the connection is closed otherwise. Beyond max_connections a client gets 503.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 32
    token: bytes | None = None  # when set, every request needs "Authorization: Bearer TOKEN"


# -- the repository memory of --workspace ------------------------------------------------


class WorkspaceRefused(ValueError):
    """The folder cannot be served as a workspace; the message says why and what to pass instead."""


def workspace_problem(root: str) -> str:
    """Why `root` cannot be served as a workspace ('' when it can), with what to pass instead:
    `/`, the home folder and its parents are refused by the language server's own rule
    (lsp.discovery.refusal), and the folder must exist."""
    refused = discovery.refusal(root)
    if refused:
        return (f"{refused}: not served (a workspace is one project folder; this one holds all your projects "
                "and your secrets); pass the folder of the project you edit, e.g. --workspace ~/src/myproject")
    if not os.path.isdir(root):
        return f"{root} is not a folder; pass the folder of the project you edit, e.g. --workspace ~/src/myproject"
    return ""


def indexed_path(path: str, roots: tuple[str, ...], indexed: set[str] | list[str]) -> str | None:
    """The indexed file (its path relative to the folder, as the index keeps it) that a prompt's
    `path` names, or None. `roots`: the folder's absolute path as given and as resolved. String
    work only, nothing on disk is looked at: a path relative to the folder, the same with the
    folder's own name first (Zed's paths start with the worktree's name), or an absolute path
    under the folder. A path with a `..` component, or an absolute path elsewhere, names nothing."""
    if not path or "\x00" in path or len(path) > MAX_PATH_CHARS:
        return None
    p = path.replace("\\", "/")
    candidates: list[str] = []
    if p.startswith("/"):
        for root in roots:
            prefix = root.rstrip("/") + "/"
            if p.startswith(prefix):
                candidates.append(p[len(prefix) :])
    else:
        first, _, rest = p.partition("/")
        if rest and first in {os.path.basename(root.rstrip("/")) for root in roots}:
            candidates.append(rest)
        candidates.append(p)
    for candidate in candidates:
        parts = [x for x in candidate.split("/") if x not in ("", ".")]
        if not parts or ".." in parts:
            continue
        rel = "/".join(parts)
        if rel in indexed:
            return rel
    return None


class FolderIndex:
    """The repository memory of one folder for the endpoint: lsp.workspace_index.WorkspaceIndex, the
    language server's indexer (walk, ignore rules, secrets, caps, the on-disk cache in
    lsp.index_store), with the folder as its only root. The endpoint gets no file events, so
    the folder is rescanned by size and mtime every `options.rescan_s`."""

    def __init__(self, root: str, options: IndexOptions | None = None) -> None:
        root = os.path.abspath(root)
        problem = workspace_problem(root)
        if problem:
            raise WorkspaceRefused(problem)
        # The language server's memory query, imported here: only an endpoint with a workspace
        # pays for loading it.
        from dlm.lsp.memory_proposals import memory_proposals, shipped_ranker

        self.root = root
        self.roots = tuple(dict.fromkeys((root, os.path.realpath(root))))  # as given, as resolved
        self.proposals = memory_proposals
        options = options or IndexOptions()
        self.ranker = shipped_ranker() if options.rank_drafts else None
        self.index = WorkspaceIndex(options)
        self.index.set_roots([root])

    def status(self) -> dict[str, Any]:
        return self.index.status()

    def current(self, zp: ZedPrompt) -> tuple[Any, str] | None:
        """(memory, the current file's path in it) for a prompt: '' for a prompt that names no
        file (fill-in-the-middle, plain), the indexed file its path names otherwise; None while
        the memory loads, or when the path names no indexed file of the folder."""
        memory = self.index.memory
        if memory is None:
            return None
        if not zp.path:
            return memory, ""
        rel = indexed_path(zp.path, self.roots, memory.paths())
        return None if rel is None else (memory, rel)

    def with_memory(self, built: Built, zp: ZedPrompt, memory: Any, rel: str) -> Built:
        """`built` (a typing prompt) with the memory's proposals at the cursor and snippets of
        other files, as the language server adds them: the prompt's text is the current
        document (the memory reads nothing else of this file)."""
        with self.index.prediction():  # the indexer starts nothing while it runs
            proposals = self.proposals(memory, zp.text[: zp.cursor], zp.text[zp.cursor :], rel, {}, self.ranker)
            typed = context.with_snippets(context.BuiltContext(built.prompt, 0, 0, "typing"), memory, rel)
        return replace(built, prompt=replace(typed.prompt, proposals=proposals))

    def close(self) -> None:
        self.index.close()


def typing_request(zp: ZedPrompt) -> bool:
    """Does the language server's typing mode (an insertion at the cursor, the memory consulted)
    answer this prompt? A fill-in-the-middle or plain answer is an insertion; a zeta answer is
    one where the cursor is at a completion point (context.at_completion_point), as the server
    chooses; elsewhere a zeta answer rewrites the region around the cursor."""
    if zp.format not in ("zeta", "zeta2"):
        return True
    line, col = cursor_line(zp)
    return context.at_completion_point(line, col)


def server_prompt(zp: ZedPrompt, ext: dict) -> Built:
    """The Prompt of a `suffix` request from the language server (coder_model.hosted.prompts.dlm_fields):
    its editable region, language, path and mode, as it would have given them to the embedded model."""
    before, after = ext["region"]
    start, end = zp.cursor - min(before, zp.cursor), min(len(zp.text), zp.cursor + after)
    t = zp.text
    prompt = Prompt(prefix=t[:start], region=t[start:end], cursor=zp.cursor - start, suffix=t[end:],
                    language=ext["language"] or language_for_path(zp.path), path=zp.path, insert=ext["insert"])
    return Built(prompt, start, end)


def statement_end(zp: ZedPrompt) -> int | None:
    """Where the language server's typing region ends for the cursor of `zp` (coder_model.regions:
    the cursor line and the rest of its statement, over a tree of the prompt's text), as an offset
    in its text; None without a grammar for the file's language."""
    span = regions.statement_spans(zp.text, language_for_path(zp.path)) if zp.path else None
    if span is None:
        return None
    lines = regions.split_lines(zp.text)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line))
    row = bisect.bisect_right(starts, zp.cursor) - 1
    _, end = regions.region_rows(lines, row, zp.cursor - starts[row], "typing", regions.RegionBudget(), span)
    return starts[end] + len(regions.content(lines[end]))


def breaks_syntax(zp: ZedPrompt, built: Built, new_region: str) -> str | None:
    """Why the insertion the answer makes at the cursor would break the code's syntax, or None
    (lsp.syntax_check on the prompt's text, as the server checks an inline insertion; a prompt
    with no language, or no insertion, is not checked). A failure of the check shows it."""
    p = built.prompt
    sugg = postprocess.suggest(p.region, p.cursor, new_region, p.suffix, p.prefix)
    if not sugg.insert_text or not p.language:
        return None
    try:
        return syntax_check.check_text(p.language, zp.text[: zp.cursor], zp.text[zp.cursor :], sugg.insert_text,
                                       sugg.replace_end is not None)
    except Exception:  # a grammar edge case must not cost the answer
        log.exception("syntax check failed")
        return None


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
    except RecursionError:
        raise RequestError(400, "the JSON body is nested too deeply; send {\"model\", \"prompt\", ...}") from None
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
    if max_tokens is not None:  # the shared validator: a boolean, 1e400 or 2.5 is not a token count
        max_tokens, problem = limits.check("max_tokens", max_tokens, limits.REQUEST_CAPS["max_tokens"])
        if problem is not None:
            raise RequestError(400, problem)
    model = req.get("model", "")
    suffix = req.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise RequestError(400, "'suffix' must be a string (the text after the cursor)")
    if suffix is not None and len(prompt) + len(suffix) > max_chars:
        raise RequestError(413, f"'prompt' and 'suffix' have {len(prompt) + len(suffix)} characters, over the "
                           f"{max_chars} limit")
    ext = req.get(DLM_FIELD)
    if ext is not None:
        ext = parse_dlm_fields(ext, len(prompt), len(suffix or ""))
    # A lone surrogate is valid JSON ("\ud800") but no tokenizer takes it: U+FFFD, as the LSP does.
    return {"prompt": limits.clean_text(prompt), "stop": [limits.clean_text(s) for s in stop],
            "max_tokens": max_tokens, "model": model if isinstance(model, str) else "",
            "suffix": None if suffix is None else limits.clean_text(suffix), "dlm": ext}


def parse_dlm_fields(ext: Any, prompt_chars: int, suffix_chars: int) -> dict:
    """The language server's fields of a `suffix` request (coder_model.hosted.prompts.dlm_fields):
    {"region": [before, after], "language", "path", "insert"}; RequestError (400) otherwise."""
    if not isinstance(ext, dict):
        raise RequestError(400, f"'{DLM_FIELD}' must be an object")
    region = ext.get("region")
    if not (isinstance(region, list) and len(region) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in region)):
        raise RequestError(400, f"'{DLM_FIELD}.region' must be [characters before the cursor, after it]")
    if region[0] > prompt_chars or region[1] > suffix_chars:
        raise RequestError(400, f"'{DLM_FIELD}.region' reaches past the prompt or the suffix")
    language, path, insert = ext.get("language", ""), ext.get("path", ""), ext.get("insert", True)
    if not isinstance(language, str) or not isinstance(path, str) or not isinstance(insert, bool):
        raise RequestError(400, f"'{DLM_FIELD}': language and path are strings, insert a boolean")
    return {"region": region, "language": limits.bound_language(language), "path": path[:MAX_PATH_CHARS],
            "insert": insert}


def params_for_max_tokens(params: SamplerParams, max_tokens: int | None) -> SamplerParams:
    """`params` writing at most `max_tokens` tokens: the model writes into block_len x max_blocks
    masked slots, so fewer slots bound the completion (OpenAI's max_tokens; a zeta answer also
    repeats the unchanged rest of Zed's editable region, which the model does not write)."""
    if max_tokens is None or max_tokens >= params.block_len * params.max_blocks:
        return params
    if max_tokens <= params.block_len:
        return replace(params, block_len=max_tokens, max_blocks=1)
    return replace(params, max_blocks=max_tokens // params.block_len)


def fit_to_budget(built: Built, budget: LayoutBudget, server_region: bool = False) -> Built | None:
    """The prompt cut to what the model takes (coder_model.budget), or None when its region
    cannot fit: the engine cuts prefix, suffix and history in tokens but takes the region,
    which the model rewrites, whole (a minified line of 20k characters would overflow it).
    `server_region`: the language server's region (its region rules bound it), refused only
    past what the whole context could hold."""
    region = built.prompt.region
    if server_region:
        if len(region) > budget.max_context * budget_rules.MAX_CHARS_PER_TOKEN:
            return None
    elif not budget_rules.region_fits(region, budget):
        return None
    return replace(built, prompt=budget_rules.clip_prompt(built.prompt, budget))


class Predictor:
    """Parse -> predict -> render, with latest-wins cancellation per file."""

    def __init__(self, holder: EngineHolder, opts: EndpointOptions, workspace: FolderIndex | None = None):
        self.holder = holder
        self.opts = opts
        self.workspace = workspace  # the repository memory (--workspace), or None
        # The sampler options go through the caps every door shares (coder_model.limits).
        self.params, problems = limits.sampler_params(opts.sampler, "sampler.")
        for problem in problems:
            log.warning("endpoint option %s; using the default", problem)
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
        snippets: tuple = ()
        ext = req.get("dlm") if req.get("suffix") is not None else None  # the language server's own fields
        if req.get("suffix") is not None:  # OpenAI's fill in the middle: the file headers, then the prefix
            path, snippets, prefix = read_file_headers(req["prompt"])
            zp = ZedPrompt(format=SUFFIX_FORMAT, text=prefix + req["suffix"], cursor=len(prefix),
                           editable=(0, len(prefix) + len(req["suffix"])), path=(ext or {}).get("path") or path)
        else:
            try:
                zp = parse_prompt(req["prompt"])
            except PromptFormatError as exc:
                raise RequestError(400, str(exc)) from None
        engine = self.engine()
        # The repository memory: only with --workspace, and only for a prompt of no file or of an
        # indexed file of the folder (FolderIndex.current); the rest is answered by the model alone.
        found = self.workspace.current(zp) if self.workspace is not None else None
        # a `suffix` request is an insertion at the cursor: the language server's typing mode, its
        # region the cursor line and the rest of its statement
        typing = (found is not None or zp.format == SUFFIX_FORMAT) and typing_request(zp)
        if ext is not None and zp.format == SUFFIX_FORMAT:  # the language server's own region and mode
            typing = ext["insert"]
            built = server_prompt(zp, ext)
        else:
            end = statement_end(zp) if zp.format == SUFFIX_FORMAT else None
            built = build_prompt(zp, self.opts.zeta_lines_before, self.opts.zeta_lines_after, typing, end)
        if snippets:
            built = replace(built, prompt=replace(built.prompt, snippets=snippets))
        # the language server's own region (the `dlm` field) goes to the model as the language server
        # would give it to its embedded one: whole, as the layout takes it
        built = fit_to_budget(built, engine.budget, server_region=ext is not None)
        if built is None:
            log.info("%s: the region around the cursor is longer than the model's context takes "
                     "(a minified line?); answered no suggestion", zp.path or "<untitled>")
            return self.answer(req, "", 0, 0)
        # path, language and history entries cut to coder_model.limits before the tokenizer
        built = replace(built, prompt=limits.bound_fields(built.prompt))
        params = params_for_max_tokens(self.params, req["max_tokens"])
        key = zp.path or "<untitled>"
        cancel = CancelToken()
        with self._lock:
            old = self._inflight.get(key)
            if old is not None:
                old.cancel()  # Zed has moved on: a newer keystroke in the same file
            self._inflight[key] = cancel
        t0 = time.perf_counter()
        try:
            if typing and found is not None and self.workspace is not None:
                try:
                    built = self.workspace.with_memory(built, zp, *found)
                except Exception:  # a memory failure costs this request its proposals, never the endpoint
                    log.exception("%s: the repository memory failed; answering with the model alone", key)
            pred = engine.predict(built.prompt, params, cancel, deadline)
        finally:
            with self._lock:
                if self._inflight.get(key) is cancel:
                    del self._inflight[key]
        verdict = gate.decide(pred.confidence, False, pred.late or time.monotonic() > deadline,
                              self.opts.min_confidence, 1.0)
        p = built.prompt
        held = None if pred.cancelled else postprocess.degenerate_reason(p.region, pred.text, p.prefix, p.suffix)
        if held:  # degenerate filler (coder_model.degenerate): answered as no suggestion
            log.info("%s: held back a degenerate answer (%s)", key, held)
        leaked = [] if pred.cancelled else secrets.introduced_secrets(pred.text, p.region)
        if leaked:  # a secret the region did not hold (seen in a prompt, or made up): never answered
            log.warning("%s: held back an answer holding %d secret(s) (coder_model.secrets)", key, len(leaked))
        shown = not pred.cancelled and verdict.show and not held and not leaked
        # An insertion at the cursor that would break the code is never shown (lsp.syntax_check),
        # as the language server holds back such an inline suggestion. A request of the language
        # server itself (the `dlm` field) is checked there, against the whole document, of which
        # this prompt holds only a window: a window that starts inside a string would read wrong.
        insertion = (typing or zp.format not in ("zeta", "zeta2")) and ext is None
        broken = breaks_syntax(zp, built, pred.text) if shown and insertion else None
        if broken:
            log.info("%s: held back an insertion that %s", key, broken)
        text = render_answer(zp, built, pred.text, req["stop"]) if shown and not broken else ""
        log.info(
            "%s %s%s: %.0f ms, %d steps, %d tokens, %d memory proposals, confidence %s%s",
            zp.format, key, " (typing)" if typing else "", (time.perf_counter() - t0) * 1000, pred.steps,
            pred.tokens, len(p.proposals), pred.confidence,
            " (cancelled)" if pred.cancelled else "" if verdict.show else f" (not shown: {verdict.reason})",
        )  # fmt: skip
        return self.answer(req, text, pred.context_tokens, pred.tokens)

    @staticmethod
    def answer(req: dict, text: str, prompt_tokens: int, completion_tokens: int) -> dict:
        """The OpenAI /v1/completions response (the fields Zed's RawCompletionResponse reads)."""
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": req["model"] or "dlm",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


DISCARD_BODY_BYTES = 64 * 1024  # an unread body up to this size is read and dropped; a larger one closes
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
_WILDCARDS = {"", "0.0.0.0", "::"}


def host_allowed(host_header: str, listen_host: str) -> bool:
    """Does the Host header name this endpoint? Loopback names always do, and so does the
    listen address; on a wildcard address (0.0.0.0, ::) any does (the token guards it)."""
    if listen_host in _WILDCARDS:
        return True
    name = host_header.strip().lower()
    if name.startswith("["):  # [v6]:port
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    listen = listen_host.strip("[]").lower()
    if name in _LOCAL_NAMES or name == listen:
        return True
    try:
        return ipaddress.ip_address(name) == ipaddress.ip_address(listen)
    except ValueError:
        return False


class EndpointServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on open connections (one thread each)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, listen_host: str, opts: EndpointOptions) -> None:
        super().__init__(address, handler)
        self.listen_host = listen_host
        self.opts = opts
        self._lock = threading.Lock()
        self.active = 0
        self.refused = 0  # connections answered 503 for being over max_connections

    def process_request(self, request, client_address) -> None:
        with self._lock:
            full = self.active >= self.opts.max_connections
            if full:
                self.refused += 1
            else:
                self.active += 1
        if not full:
            super().process_request(request, client_address)
            return
        body = json.dumps({"error": {
            "message": f"the endpoint has {self.opts.max_connections} open connections, its limit; "
                       "retry, or close idle connections", "type": "server_error", "code": 503}}).encode()
        try:
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self.active -= 1


def make_server(host: str, port: int, predictor: Predictor) -> EndpointServer:
    opts = predictor.opts

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "dlm-lsp-http"
        # the headers and the body are two writes: without TCP_NODELAY a kept-alive client's delayed
        # ACK holds the body back (up to 40 ms on Linux)
        disable_nagle_algorithm = True
        _timer: threading.Timer | None = None
        _unread = 0  # bytes of the body not read yet (-1: unknown)

        def log_message(self, fmt: str, *args) -> None:  # route to logging, not stderr
            log.debug("%s " + fmt, self.address_string(), *args)

        # ---- deadlines: a timer shuts the socket, so a blocked read returns at once ----------------
        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()

            def expire() -> None:
                log.info("closing the connection from %s: %s did not arrive within %g s",
                         self.client_address[0], what, seconds)
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            self._timer = threading.Timer(seconds, expire)
            self._timer.daemon = True
            self._timer.start()

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def handle_one_request(self) -> None:
            self._unread = 0
            self._arm(opts.header_timeout_s, "a complete request line and headers")
            try:
                super().handle_one_request()
            finally:
                self._disarm()

        # ---- answers --------------------------------------------------------------------------------
        def _send(self, status: int, obj: dict, headers: dict[str, str] | None = None) -> None:
            if self._unread:
                self._drop_body()
            data = json.dumps(obj).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def _drop_body(self) -> None:
            """An error answered before the body was read: read a small body and drop it, else
            close the connection after the answer, so the body is never read as a next request."""
            n, self._unread = self._unread, 0
            if 0 < n <= DISCARD_BODY_BYTES:
                self._arm(opts.body_timeout_s, "the request body")
                try:
                    got = len(self.rfile.read(n))
                finally:
                    self._disarm()
                if got == n:
                    return
            self.close_connection = True

        def _error(self, exc: RequestError, headers: dict[str, str] | None = None) -> None:
            self._send(exc.status, {"error": {"message": exc.message, "type": exc.kind, "code": exc.status}},
                       headers)

        # ---- checks on every request -----------------------------------------------------------------
        def _check(self, post: bool) -> None:
            """RequestError when the request may not be served (see the module docstring)."""
            self._disarm()  # the headers are in
            if self.headers.get("Transfer-Encoding"):
                self._unread = -1  # a body of unknown length: never read as a request
                raise RequestError(411, "chunked bodies are not taken; send Content-Length")
            try:
                self._unread = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._unread = -1
                raise RequestError(400, "Content-Length is not a number") from None
            if self._unread < 0:
                self._unread = -1
                raise RequestError(400, "Content-Length is negative")
            origin = self.headers.get("Origin")
            if origin is not None:
                raise RequestError(403, f"requests from web pages are refused (Origin: {origin[:100]}); "
                                   "the endpoint is for editors on this machine", "permission_error")
            host_header = self.headers.get("Host")
            if host_header is None or not host_allowed(host_header, self.server.listen_host):
                raise RequestError(403, f"Host {host_header!r} does not name this endpoint; use "
                                   f"{self.server.listen_host} or localhost", "permission_error")
            if opts.token is not None:
                auth = self.headers.get("Authorization", "")
                scheme, _, given = auth.partition(" ")
                if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), opts.token):
                    raise RequestError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN' with the "
                                       "endpoint's token (in Zed: the provider's API key)", "authentication_error")
            if post:
                ctype = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
                if ctype != "application/json":
                    raise RequestError(415, f"Content-Type {ctype or 'none'!r}: send application/json")

        def do_GET(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                self._check(post=False)
            except RequestError as exc:
                self._error(exc, {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)
                return
            if path in ("/health", "/v1/health"):
                h = predictor.holder
                state = "failed" if h.error else ("ready" if h.engine is not None else "loading")
                health: dict[str, Any] = {"status": state, "message": h.error}
                if predictor.workspace is not None:  # {state, files, tokens, message}, as dlm/status has it
                    health["index"] = predictor.workspace.status()
                self._send(200, health)
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "dlm", "object": "model", "owned_by": "dlm-lsp"}]})
            else:
                self._error(RequestError(404, f"no GET {path}; POST /v1/completions", "not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            try:
                self._check(post=True)
                if path not in ("/v1/completions", "/completions"):
                    raise RequestError(404, f"no POST {path}; the endpoint is /v1/completions", "not_found")
                n = self._unread
                if n <= 0:
                    raise RequestError(400, "empty body; send a JSON object with 'prompt'")
                limit = opts.max_prompt_chars * 4
                if n > limit:
                    raise RequestError(413, f"request body of {n} bytes is over the {limit}-byte limit")
                self._arm(opts.body_timeout_s, "the request body")
                try:
                    body = self.rfile.read(n)
                finally:
                    self._disarm()
                self._unread = 0
                if len(body) < n:  # the client went away, or was too slow: nothing to answer
                    self.close_connection = True
                    return
                req = parse_request(body, opts.max_prompt_chars)
                self._send(200, predictor.complete(req))
            except RequestError as exc:
                self._error(exc, {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)
            except Exception as exc:
                log.exception("request failed")
                self._error(RequestError(500, f"prediction failed: {exc}; see the dlm-lsp http log", "server_error"))

    return EndpointServer((host, port), Handler, host, opts)


# -- CLI -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8765", help="HOST:PORT to serve on (default 127.0.0.1:8765)")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    add_device_argument(parser)
    parser.add_argument("--remote", default=None, help="HOST:PORT of a `dlm-lsp serve` GPU box instead of a local model")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="shared token (default: $DLM_TOKEN): clients must send 'Authorization: Bearer TOKEN'; "
                        "required to listen on a non-loopback address; also sent to --remote")
    parser.add_argument("--workspace", default=None, metavar="DIR",
                        help="index DIR (the project you edit) as the language server does and answer from its "
                        "repository memory too; needs --token-file (or DLM_TOKEN), even on loopback")
    parser.add_argument("--max-connections", type=int, default=EndpointOptions.max_connections,
                        help="open connections served at once; more get 503 (default %(default)s)")
    parser.add_argument("--tls", action="store_true", help="use TLS to the --remote server")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR, any case (default INFO)")
    parser.add_argument("--deadline-ms", type=int, default=EndpointOptions.deadline_ms,
                        help="answer within this many ms of a request, or answer nothing (default %(default)s)")
    parser.add_argument("--min-confidence", type=float, default=EndpointOptions.min_confidence,
                        help="answer only suggestions at this calibrated confidence or above (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    from dlm.lsp.heap import fix_mmap_threshold

    fix_mmap_threshold()  # a --workspace index's dropped tables go back to the system
    try:
        host, port = parse_host_port(args.listen, default_port=None)
    except ValueError as exc:
        print(f"dlm-lsp http: --listen {exc}; use e.g. --listen 127.0.0.1:8765", file=sys.stderr)
        return 2
    try:
        token = load_token(args.token_file)  # the file, else $DLM_TOKEN, else None
        check_bind_allowed(host, token)  # off loopback, anyone who can reach the port could use it
    except AuthConfigError as exc:
        print(f"dlm-lsp http: {exc}", file=sys.stderr)
        return 2
    workspace_dir = getattr(args, "workspace", None)
    if workspace_dir is not None:
        if token is None:  # the endpoint would hand the folder's code to any local user
            print("dlm-lsp http: --workspace serves your code to whoever can reach the port, so it needs a token, "
                  "even on 127.0.0.1: create one with `python -c 'import secrets; print(secrets.token_hex(32))' "
                  "> ~/.config/dlm/token && chmod 600 ~/.config/dlm/token`, pass --token-file ~/.config/dlm/token "
                  "(or set DLM_TOKEN), and give Zed the same token as the provider's API key", file=sys.stderr)
            return 2
        workspace_dir = os.path.abspath(expand_path(workspace_dir))
        problem = workspace_problem(workspace_dir)  # before the model loads or the port opens
        if problem:
            print(f"dlm-lsp http: --workspace {workspace_dir}: {problem}", file=sys.stderr)
            return 2
    if args.max_connections < 1:
        print("dlm-lsp http: --max-connections must be >= 1", file=sys.stderr)
        return 2
    high = int(limits.REQUEST_CAPS["deadline_ms"].high)  # the LSP's deadlineMs range (lsp.options)
    if not 1 <= args.deadline_ms <= high or not 0 <= args.min_confidence <= 1:
        print(f"dlm-lsp http: --deadline-ms must be in [1, {high}] and --min-confidence in [0, 1]", file=sys.stderr)
        return 2
    holder = EngineHolder(make_engine_factory(args))
    predictor = Predictor(holder, EndpointOptions(deadline_ms=args.deadline_ms, min_confidence=args.min_confidence,
                                                  max_connections=args.max_connections, token=token))
    try:
        server = make_server(host, port, predictor)
    except OSError as exc:
        print(f"dlm-lsp http: cannot listen on {host}:{port} ({exc}); pick another --listen port", file=sys.stderr)
        return 2
    if workspace_dir is not None:
        try:
            predictor.workspace = FolderIndex(workspace_dir)
        except WorkspaceRefused as exc:  # checked above; the folder may have gone since
            print(f"dlm-lsp http: --workspace {workspace_dir}: {exc}", file=sys.stderr)
            server.server_close()
            return 2
    holder.start()
    h, p = server.server_address[:2]
    print(f"dlm-lsp http: listening on http://{h}:{p}/v1/completions"
          + (f", repository memory of {predictor.workspace.root}" if predictor.workspace else ""),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        holder.close()
        if predictor.workspace is not None:
            predictor.workspace.close()  # saves the index if it changed, releases its lock
    return 0

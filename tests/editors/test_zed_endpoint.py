"""The Zed endpoint (`dlm-lsp http`): Zed's prompt formats parsed back, and real-format
requests posted to the running endpoint with a tiny random model.

The prompts are built here the way Zed builds them (crates/edit_prediction fim.rs
`format_fim_prompt`, zeta_prompt zeta1 `format_zeta1_prompt`/`format_zeta1_excerpt`, and
zeta_prompt's zeta2 layouts: v0131 git merge markers with the prefix first (Zed's default),
v0120 merge markers after the suffix, v0113 ordered and v0112 middle-at-end), and posted
as the request bodies Zed sends; plain prompts as other OpenAI-compatible clients send them.
A random model writes arbitrary text, so the tests check the plumbing (parse, the
answer is the engine's prediction rendered in the request's format, Zed can read it),
not what the text says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from dlm.coder_model.edit_history import render_event
from dlm.coder_model.remote.listening import read_listening_address
from dlm.lsp import http_endpoint as he
from dlm.lsp import zed_prompts as zed

FILE = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    ret\n\nprint(add(1, 2))\n"
CURSOR = FILE.index("    ret\n") + len("    ret")


def zed_fim(fmt: str, prefix: str, suffix: str) -> str:
    return {
        "code_llama": f"<PRE> {prefix} <SUF>{suffix} <MID>",
        "star_coder": f"<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
        "deepseek_coder": f"<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
        "qwen": f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
        "codestral": f"[SUFFIX]{suffix}[PREFIX]{prefix}",
        "glm": f"<|code_prefix|>{prefix}<|code_suffix|>{suffix}<|code_middle|>",
    }[fmt]


ZETA_INSTRUCTION = (
    "### Instruction:\n"
    "You are a code completion assistant and your task is to analyze user edits and then rewrite an "
    "excerpt that the user provides, suggesting the appropriate edits within the excerpt, taking "
    "into account the cursor location.\n\n"
    "### User Edits:\n\n"
)


def zed_zeta1(path: str, excerpt: str, editable: tuple[int, int], cursor: int, events: list[tuple[str, str]]) -> str:
    """zeta1 prompt as Zed formats it; context = the whole excerpt, starting at row 0."""
    ev = "\n\n".join(f"User edited {p}:\n```diff\n{d}\n```" for p, d in events)
    s, e = editable
    ex = f"```{path}\n<|start_of_file|>\n" + excerpt[:s] + "<|editable_region_start|>\n"
    ex += excerpt[s:cursor] + "<|user_cursor_is_here|>" + excerpt[cursor:e] + "\n<|editable_region_end|>"
    ex += excerpt[e:] + "\n```"
    return ZETA_INSTRUCTION + ev + "\n\n### User Excerpt:\n\n" + ex + "\n\n### Response:\n"


def zed_clean_zeta1(output: str) -> str:
    """Zed's clean_zeta1_model_output (without the cursor): the new editable region."""
    c = output.replace("<|user_cursor_is_here|>", "")
    i = c.find("<|editable_region_start|>")
    start = 0 if i < 0 else i + len("<|editable_region_start|>")
    if c[start : start + 1] == "\n":
        start += 1
    j = c.find("<|editable_region_end|>")
    end = len(c) if j < 0 else (j - 1 if j > 0 and c[j - 1] == "\n" else j)
    return c[start:end]


# -- zeta2, as crates/zeta_prompt writes it ----------------------------------------------------------


def zed_zeta2(layout: str, path: str, excerpt: str, editable: tuple[int, int], cursor: int,
              events: list[tuple[str, str]] = (), related: list[tuple[str, str]] = (), prefill: str = "") -> str:
    """A zeta2 prompt: related files, the edit history, then the cursor's file in `layout`
    (pushed piece by piece as zeta_prompt.rs does, newline added where the prompt lacks one)."""
    out: list[str] = []

    def push(*pieces: str) -> None:
        out.extend(pieces)

    def newline() -> None:  # Zed: if !prompt.ends_with('\\n') { prompt.push('\\n') }
        if not "".join(out).endswith("\n"):
            out.append("\n")

    for p, text in related:
        push(f"<|file_sep|>{p}\n", text)
        newline()
    if events:
        push("<|file_sep|>edit history\n", *(f"--- a/{p}\n+++ b/{p}\n{d}" for p, d in events))
    s, e = editable
    before, after = excerpt[:s], excerpt[e:]
    region = (excerpt[s:cursor], "<|user_cursor|>", excerpt[cursor:e])
    push(f"<|file_sep|>{path}\n")
    if layout == "v0131":
        push("<|fim_prefix|>", before, "<<<<<<< CURRENT\n", *region)
        newline()
        push("=======\n", "<|fim_suffix|>", after)
        newline()
        push("<|fim_middle|>", prefill)
    elif layout == "v0120":
        push("<|fim_prefix|>", before, "<|fim_suffix|>", after)
        newline()
        push("<|fim_middle|>", "<<<<<<< CURRENT\n", *region)
        newline()
        push("=======\n")
    elif layout == "v0113":
        push("<|fim_prefix|>\n", before)
        newline()
        push("<|fim_middle|>current\n", *region)
        newline()
        push("<|fim_suffix|>\n", after)
        newline()
        push("<|fim_middle|>updated\n")
    elif layout == "v0112":
        push("<|fim_prefix|>\n", before, "<|fim_suffix|>\n", after)
        newline()
        push("<|fim_middle|>current\n", *region)
        newline()
        push("<|fim_middle|>updated\n")
    return "".join(out)


def zed_parse_zeta2_output(output: str, end_marker: str = ">>>>>>> UPDATED\n") -> str:
    """Zed's parse_zeta2_model_output for these layouts: the end marker stripped when it ends the output."""
    return output.removesuffix(end_marker)


S2, E2 = FILE.index("def add"), FILE.index("\nprint") + 1  # whole lines, as Zed's editable ranges are
EDIT_DIFF = "@@ -4,3 +4,4 @@\n \n+def mul(a, b):\n+    ret\n \n"


@pytest.mark.parametrize("layout", ["v0131", "v0120", "v0113", "v0112"])
def test_zeta2_layouts_parse_to_the_excerpt_cursor_and_edits(layout):
    prompt = zed_zeta2(layout, "proj/m.py", FILE, (S2, E2), CURSOR, events=[("proj/m.py", EDIT_DIFF)],
                       related=[("proj/util.py", "def helper():\n    pass\n")])
    zp = zed.parse_prompt(prompt)
    assert zp.format == "zeta2" and zp.path == "proj/m.py"
    assert zp.text == FILE and zp.cursor == CURSOR and zp.editable == (S2, E2)
    assert zp.end_marker == (">>>>>>> UPDATED\n" if layout in ("v0131", "v0120") else "")
    assert zp.history == (render_event("proj/m.py", 4, [], ["def mul(a, b):", "    ret"]),)
    built = zed.build_prompt(zp)
    # the cursor line and one line either side, inside the editable range
    assert built.prompt.region == "def mul(a, b):\n    ret\n" and built.prompt.language == "python"


def test_zeta2_answer_is_the_new_editable_region_and_its_end_marker():
    zp = zed.parse_prompt(zed_zeta2("v0131", "m.py", FILE, (S2, E2), CURSOR))
    built = zed.build_prompt(zp, zeta_lines_before=0, zeta_lines_after=0)
    out = zed.render_answer(zp, built, "    return a * b", [])
    assert out.endswith(">>>>>>> UPDATED\n")
    new_editable = zed_parse_zeta2_output(out)
    assert new_editable == FILE[S2:E2].replace("    ret\n", "    return a * b\n")
    # a stop sequence that is the end marker: a server stops before it, so it is not sent
    assert zed.render_answer(zp, built, "    return a * b", [">>>>>>> UPDATED"]) == new_editable
    # v0113 has no end marker: the answer is the region itself
    zp = zed.parse_prompt(zed_zeta2("v0113", "m.py", FILE, (S2, E2), CURSOR))
    built = zed.build_prompt(zp, zeta_lines_before=0, zeta_lines_after=0)
    assert zed.render_answer(zp, built, "    return a * b", []) == new_editable


def test_zeta2_prefill_is_kept_and_the_answer_continues_it():
    prefill = FILE[S2 : FILE.index("\n", S2) + 1]  # Zed's v0211 prefill: the region's first line
    zp = zed.parse_prompt(zed_zeta2("v0131", "m.py", FILE, (S2, E2), CURSOR, prefill=prefill))
    assert zp.editable == (S2 + len(prefill), E2)
    built = zed.build_prompt(zp)
    assert not built.prompt.region.startswith("def add")  # the model cannot rewrite the prefill
    out = zed.render_answer(zp, built, built.prompt.region, [])
    assert prefill + zed_parse_zeta2_output(out) == FILE[S2:E2]  # Zed: output = prefill + response


def test_plain_prompts_are_continued():
    zp = zed.parse_prompt("def f(x):\n    return")
    assert zp.format == "plain" and zp.cursor == len(zp.text) and zp.text == "def f(x):\n    return"
    built = zed.build_prompt(zp)
    assert built.prompt.region == "    return" and built.prompt.suffix == ""
    assert zed.render_answer(zp, built, "    return x * 2", []) == " x * 2"
    assert zed.render_answer(zp, built, "    return x * 2", ["*"]) == " x "


def test_stop_may_be_a_string_or_a_list():
    body = json.dumps({"model": "dlm", "prompt": "x = ", "stop": "\n"}).encode()
    assert he.parse_request(body, 1000)["stop"] == ["\n"]
    body = json.dumps({"model": "dlm", "prompt": "x = ", "stop": ["\n", "#"]}).encode()
    assert he.parse_request(body, 1000)["stop"] == ["\n", "#"]


@pytest.mark.parametrize("fmt", ["code_llama", "star_coder", "deepseek_coder", "qwen", "codestral", "glm"])
def test_fim_formats_parse_to_the_cursor(fmt):
    zp = zed.parse_prompt(zed_fim(fmt, FILE[:CURSOR], FILE[CURSOR:]))
    assert zp.text == FILE and zp.cursor == CURSOR and zp.editable == (0, len(FILE))
    built = zed.build_prompt(zp)
    assert built.prompt.region == "    ret"  # the cursor line
    assert built.prompt.cursor == 7
    assert built.prompt.prefix + built.prompt.region + built.prompt.suffix == FILE


def test_zeta1_prompt_parses_excerpt_region_cursor_and_edits():
    s = FILE.index("def mul")
    e = FILE.index("\n\nprint")
    diff = "@@ -4,3 +4,4 @@\n \n+def mul(a, b):\n+    ret"
    zp = zed.parse_prompt(zed_zeta1("proj/m.py", FILE, (s, e), CURSOR, [("proj/m.py", diff)]))
    assert zp.format == "zeta" and zp.path == "proj/m.py" and zp.start_of_file
    assert zp.text == FILE and zp.cursor == CURSOR and zp.editable == (s, e)
    # Zed's hunk (with a context line) becomes the -U0 event training renders
    assert zp.history == (render_event("proj/m.py", 4, [], ["def mul(a, b):", "    ret"]),)
    assert zp.history == ("--- a/proj/m.py\n+++ b/proj/m.py\n@@ -4,0 +5,2 @@\n+def mul(a, b):\n+    ret\n",)
    built = zed.build_prompt(zp)
    # the cursor line and one line either side, inside the editable range
    assert built.prompt.region == "def mul(a, b):\n    ret"  # the editable range ends after ret
    assert built.prompt.language == "python"


def test_zeta_answer_keeps_the_editable_text_outside_the_region():
    s, e = FILE.index("def add"), FILE.index("\n\nprint")
    zp = zed.parse_prompt(zed_zeta1("m.py", FILE, (s, e), CURSOR, []))
    built = zed.build_prompt(zp, zeta_lines_before=0, zeta_lines_after=0)
    out = zed.render_answer(zp, built, "    return a * b", ["<|editable_region_end|>"])
    assert FILE[s:e].endswith("    ret")  # the editable range ends at the cursor line
    assert zed_clean_zeta1(out) == FILE[s : e - len("    ret")] + "    return a * b"


def test_fim_answer_is_the_insertion_at_the_cursor():
    zp = zed.parse_prompt(zed_fim("qwen", FILE[:CURSOR], FILE[CURSOR:]))
    built = zed.build_prompt(zp)
    assert zed.render_answer(zp, built, "    return a * b", []) == "urn a * b"
    assert zed.render_answer(zp, built, "    return a * b", ["*"]) == "urn a "  # stop strings cut it
    assert zed.render_answer(zp, built, "    ret", []) == ""  # no change, nothing to insert


def test_malformed_zeta_prompts_are_refused_with_what_is_wrong():
    with pytest.raises(zed.PromptFormatError, match="no <\\|editable_region_end"):
        zed.parse_prompt(ZETA_INSTRUCTION + "\n\n### User Excerpt:\n\n```a\n<|editable_region_start|>\nx<|user_cursor_is_here|>")
    with pytest.raises(zed.PromptFormatError, match="zeta2_1's multi-region layout is not read"):
        zed.parse_prompt("<[fim-suffix]>\nx = 1\n<[fim-prefix]><filename>a.py\n<|marker_1|>y<|user_cursor|>\n")
    with pytest.raises(zed.PromptFormatError, match="no ======="):
        zed.parse_prompt("<|file_sep|>a.py\n<|fim_prefix|><<<<<<< CURRENT\nx<|user_cursor|>\n<|fim_suffix|>")


# -- the running endpoint ---------------------------------------------------------------


def post(url: str, body, raw: bool = False):
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def endpoint(tiny_checkpoint):
    from dlm.coder_model.engine import load_engine

    holder = he.EngineHolder(lambda: load_engine(tiny_checkpoint, "cpu"))
    # no deadline planning and no confidence gate: the answers are compared with the engine's own
    predictor = he.Predictor(holder, he.EndpointOptions(sampler={"steps": 8, "block_len": 16, "max_blocks": 1},
                                                        deadline_ms=600_000, min_confidence=0.0))
    server = he.make_server("127.0.0.1", 0, predictor)
    holder.start()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", predictor
    server.shutdown()
    server.server_close()
    holder.close()


def expected_text(predictor, prompt: str, stop: list[str]) -> str:
    """The engine's own prediction for the same Prompt, rendered (greedy decoding is deterministic)."""
    from dlm.coder_model.types import CancelToken

    zp = zed.parse_prompt(prompt)
    built = zed.build_prompt(zp, predictor.opts.zeta_lines_before, predictor.opts.zeta_lines_after)
    pred = predictor.engine().predict(built.prompt, predictor.params, CancelToken())
    return zed.render_answer(zp, built, pred.text, stop)


def test_fim_request_gets_an_openai_completion(endpoint):
    url, predictor = endpoint
    prompt = zed_fim("qwen", FILE[:CURSOR], FILE[CURSOR:])
    stop = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
    status, body = post(url + "/v1/completions", {"model": "dlm", "prompt": prompt, "max_tokens": 64, "stop": stop})
    assert status == 200, body
    # the fields Zed's RawCompletionResponse requires
    assert {"id", "object", "created", "model", "choices", "usage"} <= body.keys()
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert body["usage"]["prompt_tokens"] > 0
    assert body["choices"][0]["text"] == expected_text(predictor, prompt, stop)


def test_zeta_request_answers_a_region_zed_can_read(endpoint, monkeypatch):
    url, predictor = endpoint
    # the tiny random model may write filler, which is held back (test_degenerate_answer_is_no_suggestion);
    # this test is about the format Zed reads
    monkeypatch.setattr(he.postprocess, "degenerate_reason", lambda *a, **k: None)
    s, e = FILE.index("def add"), FILE.index("\n\nprint")
    prompt = zed_zeta1("m.py", FILE, (s, e), CURSOR, [("m.py", "@@ -5,1 +5,2 @@\n def mul(a, b):\n+    ret")])
    stop = ["<|editable_region_end|>", "<|editable_region_end|>\n"]
    status, body = post(url + "/v1/completions", {"model": "zeta", "prompt": prompt, "max_tokens": 1024, "stop": stop})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert text == expected_text(predictor, prompt, stop)
    assert text.startswith("<|editable_region_start|>\n")
    new_editable = zed_clean_zeta1(text)
    # the first line of the editable range is outside the region (cursor line +- 1) and is kept
    assert new_editable.startswith("def add(a, b):\n    return a + b\n")


def test_degenerate_answer_is_no_suggestion(endpoint, monkeypatch):
    """An engine answer that is filler (coder_model.degenerate) is answered as no suggestion,
    in the zeta layout (a whole region, no postprocess) and in fill-in-the-middle."""
    from dlm.coder_model.types import Prediction

    url, predictor = endpoint

    def filler(prompt, params, cancel, deadline=None):  # filler the embedded model wrote without the sampler's defences
        text = prompt.region[: prompt.cursor] + "get_get_get_get_get_name)" + prompt.region[prompt.cursor :]
        return Prediction(text, steps=1, tokens=1, confidence=1.0)

    monkeypatch.setattr(predictor.engine(), "predict", filler)
    s, e = FILE.index("def add"), FILE.index("\n\nprint")
    zeta = zed_zeta1("m.py", FILE, (s, e), CURSOR, [])
    fim = zed_fim("qwen", FILE[:CURSOR], FILE[CURSOR:])
    for model, prompt in (("zeta", zeta), ("dlm", fim)):
        status, body = post(url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 64,
                                                      "stop": ["<|editable_region_end|>"]})
        assert status == 200 and body["choices"][0]["text"] == "", model


def test_zeta2_request_answers_a_region_zed_can_read(endpoint, monkeypatch):
    url, predictor = endpoint
    monkeypatch.setattr(he.postprocess, "degenerate_reason", lambda *a, **k: None)  # as for zeta
    prompt = zed_zeta2("v0131", "src/m.py", FILE, (S2, E2), CURSOR, events=[("src/m.py", EDIT_DIFF)])
    # Zed's body for prompt_format "zeta2": stop_tokens_for_format is empty for the merge-marker layouts
    status, body = post(url + "/v1/completions", {"model": "zeta2", "prompt": prompt, "max_tokens": 1024,
                                                  "temperature": 0.0, "stop": []})
    assert status == 200, body
    text = body["choices"][0]["text"]
    assert text == expected_text(predictor, prompt, [])
    assert text.endswith(">>>>>>> UPDATED\n")
    # the first line of the editable range is outside the region (cursor line +- 1) and is kept
    assert zed_parse_zeta2_output(text).startswith("def add(a, b):\n    return a + b\n")


def test_plain_prompt_request_is_a_completion_after_the_prompt(endpoint):
    url, predictor = endpoint
    prompt = "import os\n\n\ndef main(argv):\n    path = os.path.join("
    for stop in ("\n", ["\n\n", ")"]):  # a string or a list, as OpenAI's API allows
        status, body = post(url + "/v1/completions", {"model": "dlm", "prompt": prompt, "max_tokens": 32,
                                                      "stop": stop})
        assert status == 200, body
        text = body["choices"][0]["text"]
        stops = [stop] if isinstance(stop, str) else stop
        assert text == expected_text(predictor, prompt, stops)
        assert not any(s in text for s in stops)


def test_bad_requests_get_clear_errors_and_the_server_goes_on(endpoint):
    url, _ = endpoint
    status, body = post(url + "/v1/completions", b"{not json", raw=True)
    assert status == 400 and "not JSON" in body["error"]["message"]
    status, body = post(url + "/v1/completions", {"model": "x", "prompt": "<|file_sep|>a.py\n<|fim_prefix|>x<|user_cursor|>"})
    assert status == 400 and "prompt_format" in body["error"]["message"]
    status, body = post(url + "/v1/completions", {"prompt": 3})
    assert status == 400 and "'prompt' must be a string" in body["error"]["message"]
    status, body = post(url + "/v1/completions", {"prompt": "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "max_tokens": -1})
    assert status == 400 and "max_tokens" in body["error"]["message"]
    status, body = post(url + "/v1/chat", {"prompt": "x"})
    assert status == 404 and "/v1/completions" in body["error"]["message"]
    status, body = post(url + "/v1/completions", {"prompt": zed_fim("star_coder", "x = ", "\n")})
    assert status == 200 and isinstance(body["choices"][0]["text"], str)


def test_a_model_that_fails_to_load_gets_503_with_the_reason():
    def broken():
        raise FileNotFoundError("model directory /nope does not exist; pass --model DIR of a checkpoint")

    holder = he.EngineHolder(broken)
    server = he.make_server("127.0.0.1", 0, he.Predictor(holder, he.EndpointOptions()))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
        status, body = post(url, {"prompt": zed_fim("qwen", "a", "b")})
        assert status == 503 and "/nope does not exist" in body["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()


def test_cli_serves_zed_requests(tiny_checkpoint):
    """`dlm-lsp http --listen 127.0.0.1:0 --model DIR` as a user starts it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlm.lsp.cli", "http", "--listen", "127.0.0.1:0", "--model", tiny_checkpoint,
         "--device", "cpu"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        url = read_listening_address(proc.stderr, 120)
        assert url, "dlm-lsp http did not print its address"
        status, body = post(url, {"model": "dlm", "prompt": zed_fim("qwen", "def f(x):\n    re", "\n"), "stop": []})
        assert status == 200, body
        assert isinstance(body["choices"][0]["text"], str)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

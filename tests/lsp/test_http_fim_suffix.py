"""`dlm-lsp http` takes OpenAI's fill in the middle (`prompt` + `suffix`), as the language server's
openai-fim engine sends it (coder_model.hosted, docs/engines.md): the Prompt its model gets is the
one the language server built, but for the edit history a fill-in-the-middle request has no place
for. A recording engine stands in for the model: these tests are about the prompt, not answers.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dlm.coder_model import limits
from dlm.coder_model.budget import plan
from dlm.coder_model.hosted import prompts
from dlm.coder_model.hosted.http_engine import secrets_masked
from dlm.coder_model.types import EngineStatus, LayoutBudget, Prediction, RetrievedSnippet
from dlm.lsp import context
from dlm.lsp import http_endpoint as he
from dlm.lsp.documents import Documents
from dlm.lsp.options import ContextOptions

BUDGET = LayoutBudget.for_window(384)
TEXT = (
    "import os\n\n\ndef load(path, mode):\n    \"\"\"Read a file.\n\n    Long description.\n    \"\"\"\n"
    "    with open(path, mode) as f:\n        data = f.read(\n            )\n    return data\n\n\nprint(load('x', 'r'))\n"
)
ROW, COL = 9, len("        data = f.read(")


class RecordingEngine:
    budget = BUDGET

    def __init__(self) -> None:
        self.prompts = []

    def predict(self, prompt, params, cancel, deadline=None):
        self.prompts.append(prompt)
        return Prediction(text=prompt.region[: prompt.cursor] + "1024" + prompt.region[prompt.cursor :], steps=1)

    def status(self):
        return EngineStatus(state="ready", device="cpu", model="recording (tests only)")

    def close(self):
        pass


@pytest.fixture()
def endpoint():
    engine = RecordingEngine()
    holder = he.EngineHolder(lambda: engine)
    holder.start()
    holder.wait_loaded(10)
    yield he.Predictor(holder, he.EndpointOptions(deadline_ms=60_000, min_confidence=0.0)), engine
    holder.close()


def server_prompt():
    """The prompt the language server builds at the cursor (typing mode), for the engine's budget."""
    doc = Documents().open("file:///ws/pkg/io.py", TEXT, 1, "python")
    built = context.build(doc, ROW, COL, "typing", ContextOptions(), context.windows_for(BUDGET, ContextOptions()),
                          "pkg/io.py")
    return limits.bound_fields(built.prompt)


def post(predictor, body: dict) -> dict:
    return predictor.complete(he.parse_request(json.dumps(body).encode(), 1_000_000))


def test_the_model_gets_the_prompt_the_language_server_built(endpoint):
    predictor, engine = endpoint
    p = server_prompt()
    assert "\n" in p.region  # the rest of the statement is in the region: the case worth checking
    sent = secrets_masked(prompts.fit(p, BUDGET, "openai-fim"))
    body = prompts.build("openai-fim", sent, "", 128, dlm_server=True).body
    answer = post(predictor, body)
    assert engine.prompts == [replace(p, history=())]
    assert answer["choices"][0]["text"] == "1024"


def test_the_language_servers_region_goes_whole_even_past_a_zed_prompts_bound(endpoint):
    predictor, engine = endpoint
    text = ("def load(path):\n    data = read_everything(path, size_limit_in_bytes_for_this_one_file=4096,\n"
            "                           encoding_of_the_file_when_it_is_text='utf-8',\n"
            "                           errors='strict')\n    return data\n")
    doc = Documents().open("file:///ws/m.py", text, 1, "python")
    built = context.build(doc, 1, len("    data = read_everything("), "typing", ContextOptions(),
                          context.windows_for(BUDGET, ContextOptions()), "m.py")
    p = limits.bound_fields(built.prompt)
    assert len(p.region.encode()) > plan(BUDGET).region_bytes  # a Zed prompt's region this long is refused
    post(predictor, prompts.build("openai-fim", prompts.fit(p, BUDGET, "openai-fim"), "", 128, dlm_server=True).body)
    assert engine.prompts == [p]


def test_without_the_language_servers_fields_the_headers_name_the_file_and_the_region_follows_the_rules(endpoint):
    predictor, engine = endpoint
    p = replace(server_prompt(), snippets=(RetrievedSnippet("pkg/util.py", "def helper():\n    return 1"),))
    body = prompts.build("openai-fim", prompts.fit(p, BUDGET, "openai-fim"), "", 128).body
    post(predictor, body)
    [q] = engine.prompts
    assert (q.path, q.language, q.insert) == ("pkg/io.py", "python", True)
    assert q.prefix == p.prefix and q.region == p.region and q.cursor == p.cursor and q.suffix == p.suffix
    assert [(s.path, s.text) for s in q.snippets] == [("pkg/util.py", "def helper():\n    return 1")]


@pytest.mark.parametrize("extra, words", [
    ({"suffix": 3}, "'suffix' must be a string"),
    ({"suffix": "", "dlm": []}, "must be an object"),
    ({"suffix": "", "dlm": {"region": [1]}}, "region"),
    ({"suffix": "", "dlm": {"region": [0, 99]}}, "reaches past"),
    ({"suffix": "", "dlm": {"region": [0, 0], "insert": "yes"}}, "boolean"),
])
def test_bad_fill_in_the_middle_fields_are_refused_with_what_is_wrong(extra, words):
    with pytest.raises(he.RequestError, match=words):
        he.parse_request(json.dumps({"prompt": "x = ", **extra}).encode(), 1000)

"""Protocol tests of the hosted engines' request bodies and answers (coder_model.hosted.prompts).

They check the shapes the builders write and the readers take against the public protocol
facts in the module's docstring; no test here claims anything about a model's answers.
"""

from __future__ import annotations

import pytest
from dlm.coder_model.budget import plan
from dlm.coder_model.hosted import prompts
from dlm.coder_model.hosted.prompts import BadAnswer
from dlm.coder_model.types import LayoutBudget, Prompt, RetrievedSnippet

HISTORY = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -3,0 +4 @@\n+import os\n"
PROMPT = Prompt(
    prefix="def total(items):\n", region="    return sum(it", cursor=17, suffix="\n\nprint(total([1]))\n",
    history=(HISTORY,), language="python", path="pkg/m.py",
    snippets=(RetrievedSnippet("pkg/util.py", "def count(items):\n    return len(items)"),),
)


def test_mercury_edit_prompt_has_its_sections_in_order_with_the_cursor_in_the_region():
    req = prompts.build("mercury-edit", PROMPT, "mercury-edit-2", 300)
    assert req.path == "/v1/edit/completions"
    assert set(req.body) == {"model", "messages", "max_tokens"}
    assert req.body["model"] == "mercury-edit-2" and req.body["max_tokens"] == 300
    [message] = req.body["messages"]
    assert message["role"] == "user"
    text = message["content"]
    order = ["<|recently_viewed_code_snippets|>", "<|recently_viewed_code_snippet|>",
             "code_snippet_file_path: pkg/util.py\n", "<|/recently_viewed_code_snippet|>",
             "<|/recently_viewed_code_snippets|>", "<|current_file_content|>", "current_file_path: pkg/m.py\n",
             "<|code_to_edit|>", "<|cursor|>", "<|/code_to_edit|>", "<|/current_file_content|>",
             "<|edit_diff_history|>", "<|/edit_diff_history|>"]
    at = [text.index(marker) for marker in order]
    assert at == sorted(at), text
    assert "<|code_to_edit|>\n    return sum(it<|cursor|>\n<|/code_to_edit|>\n\nprint(total([1]))\n" in text
    assert "def total(items):\n<|code_to_edit|>" in text  # the prefix right before the region
    assert HISTORY in text  # the edit history as its diff


def test_fim_requests_carry_prefix_and_suffix_in_each_kinds_fields():
    before, after = "def total(items):\n    return sum(it", "\n\nprint(total([1]))\n"
    headers = "# Path: pkg/util.py\n# def count(items):\n#     return len(items)\n# Path: pkg/m.py\n"
    mercury = prompts.build("mercury-fim", PROMPT, "mercury-coder", 64)
    assert mercury.path == "/v1/fim/completions"
    assert mercury.body == {"model": "mercury-coder", "prompt": headers + before, "suffix": after, "max_tokens": 64}
    openai = prompts.build("openai-fim", PROMPT, "", 64)
    assert openai.path == "/v1/completions"
    assert openai.body == {"prompt": headers + before, "suffix": after, "max_tokens": 64, "temperature": 0,
                           "stream": False}
    assert prompts.build("openai-fim", PROMPT, "qwen", 64).body["model"] == "qwen"
    llama = prompts.build("llamacpp-infill", PROMPT, "", 64)
    assert llama.path == "/infill"
    assert llama.body["input_prefix"] == before and llama.body["input_suffix"] == after
    assert llama.body["input_extra"] == [{"filename": "pkg/util.py", "text": "def count(items):\n    return len(items)"}]
    assert llama.body["n_predict"] == 64
    ollama = prompts.build("ollama", PROMPT, "qwen2.5-coder:1.5b", 64)
    assert ollama.path == "/api/generate"
    assert ollama.body["model"] == "qwen2.5-coder:1.5b" and ollama.body["stream"] is False
    assert ollama.body["prompt"] == headers + before and ollama.body["suffix"] == after
    assert ollama.body["options"]["num_predict"] == 64


def test_fit_drops_the_history_a_fim_request_has_no_place_for_and_cuts_by_the_budget():
    budget = LayoutBudget.for_window(256)
    long = Prompt(prefix="x = 1\n" * 2000, region="y = ", cursor=4, suffix="\nz = 2" * 2000, history=(HISTORY,),
                  language="python", path="m.py")
    fim = prompts.fit(long, budget, "openai-fim")
    assert fim.history == ()
    assert len(fim.prefix) <= plan(budget).prefix_room_max * 8 and fim.prefix.endswith("x = 1\n")
    assert len(fim.suffix) <= plan(budget).suffix * 8 and fim.suffix.startswith("\nz = 2")
    assert prompts.fit(long, budget, "mercury-edit").history == (HISTORY,)
    assert prompts.fit(long, budget, "openai-fim").region == "y = "  # the region is never cut


def test_file_headers_read_back_into_the_path_the_snippets_and_the_prefix():
    prefix = "# Copyright the authors\n#\n# (the file's own comments)\nimport os\n"
    p = Prompt(prefix=prefix, region="x", cursor=1, suffix="", language="python", path="pkg/m.py",
               snippets=(RetrievedSnippet("a.py", "Path: tricky\n\nvalue = 1"),))
    body = prompts.build("openai-fim", p, "", 16).body
    path, snippets, rest = prompts.read_file_headers(body["prompt"])
    assert path == "pkg/m.py"
    assert rest == prefix + "x"
    assert [(s.path, s.text) for s in snippets] == [("a.py", " Path: tricky\n\nvalue = 1")]
    assert prompts.read_file_headers("import os\n") == ("", (), "import os\n")
    c = Prompt(prefix="int x;\n", region="", cursor=0, suffix="", language="c", path="m.c")
    assert prompts.build("openai-fim", c, "", 8).body["prompt"] == "// Path: m.c\nint x;\n"


def test_answers_are_read_from_each_kinds_field():
    assert prompts.answer_text("openai-fim", {"choices": [{"text": "a"}]}) == "a"
    assert prompts.answer_text("mercury-fim", {"choices": [{"text": "b"}]}) == "b"
    assert prompts.answer_text("mercury-edit", {"choices": [{"message": {"content": "c"}}]}) == "c"
    assert prompts.answer_text("mercury-edit", {"choices": [{"message": {"content": None}}]}) is None
    assert prompts.answer_text("llamacpp-infill", {"content": "d"}) == "d"
    assert prompts.answer_text("ollama", {"response": "e", "done": True}) == "e"
    assert prompts.answer_text("openai-fim", {"choices": []}) is None
    for bad in ({"choices": "x"}, {"nothing": 1}, [1], {"choices": [{"text": 3}]}):
        with pytest.raises(BadAnswer):
            prompts.answer_text("openai-fim", bad)


def test_a_fenced_rewrite_is_the_new_region_and_none_is_no_prediction():
    region = prompts.new_region("mercury-edit", PROMPT, "```python\n    return sum(items)\n```", 300)
    assert region == "    return sum(items)"
    assert prompts.new_region("mercury-edit", PROMPT, "    return sum(it<|cursor|>ems)\n", 300) == "    return sum(items)"
    assert prompts.new_region("mercury-edit", PROMPT, None, 300) is None
    assert prompts.new_region("openai-fim", PROMPT, "ems)<|endoftext|>junk", 64) == "    return sum(items)"
    assert prompts.new_region("openai-fim", PROMPT, "", 64) is None


@pytest.mark.parametrize("answer, why", [
    ("current_file_path: other/x.py\n    return 1", "another file"),
    ("```other/x.py\n    return sum(items)\n```", "another file"),
    ("<|current_file_content|>\n    return sum(items)", "sections"),
    ("    return sum(items)" + "\n    pass" * 600, "characters"),
])
def test_rewrites_that_cannot_be_right_are_refused_with_why(answer, why):
    with pytest.raises(BadAnswer, match=why):
        prompts.new_region("mercury-edit", PROMPT, answer, 300)


def test_a_rewrite_that_shares_nothing_with_a_long_region_does_not_match_it():
    p = Prompt(prefix="", region="    result = compute_everything(alpha, beta)", cursor=10, suffix="", path="m.py")
    with pytest.raises(BadAnswer, match="does not match"):
        prompts.new_region("mercury-edit", p, "import zzz_qqq; print(1)", 300)
    assert prompts.new_region("mercury-edit", p, "    result = compute_everything(alpha, beta, gamma)", 300)
    with pytest.raises(BadAnswer, match="characters"):
        prompts.new_region("openai-fim", p, "x" * 10_000, 64)

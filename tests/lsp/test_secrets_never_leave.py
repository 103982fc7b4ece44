"""Secrets never enter the index, a memory proposal, a remote prompt or the HTTP answer.

The detector is coder_model.secrets; the product never imports detect-secrets, which these tests use
only to confirm that each example is a real shape of one of its plugins.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import Future
from pathlib import Path

import pytest
from dlm.coder_model import secrets
from dlm.coder_model.memory.index import RepoMemory
from dlm.coder_model.remote.wire import decode_body, encode_frame, predict_message
from dlm.coder_model.types import MemoryProposal, Prediction, Prompt, RetrievedSnippet, SamplerParams
from dlm.lsp import discovery
from fake_engine import on_a_thread

REPO = Path(__file__).resolve().parents[2]

# The eight shapes an abuse test found indexed in clear text (made-up values, real shapes).
HF = "hf_QmZxTnWvKpLrYsHdJfGbCeUaNoIiEkMt4x"
REPORTED = {
    "openai": 'OPENAI_API_KEY = "sk-proj-Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA-Xe_Uo2Iu7Ya"',
    "huggingface": f'HF_TOKEN = "{HF}"',
    "gitlab": 'GITLAB_TOKEN = "glpat-Zq3xR8vN2mK7pL4wT9yB"',
    "npm": "//registry.npmjs.org/:_authToken=npm_Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA1b2c",
    "stripe": "stripe.api_key = 'rk_live_51Zq3xR8vN2mK7pL4wT9yB6c'",
    "slack_webhook": 'WEBHOOK = "https://hooks.slack.com/services/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"',
    "aws_temporary": "aws_access_key_id = ASIAZQ3XR8VN2MK7PL4W",
    "database_url": 'DATABASE_URL = "postgres://app:Zq3xR8vN2mK7@db.internal:5432/app"',
}

# One example per detect-secrets plugin, in the shape its plugin documents.
PLUGIN_EXAMPLES = {
    "AWSKeyDetector": ["AKIAZQ3XR8VN2MK7PL4W",
                       'aws_secret_access_key = "wJalrXUtnFEMIK7MDENGbPxRfiCYZq3xR8vN2mK7"'],
    "AzureStorageKeyDetector": [("DefaultEndpointsProtocol=https;AccountName=x;AccountKey="
                                 "Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sAZq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sAZq3xR8vN2mK7pL4wT9yB6cJ1h==")],
    "BasicAuthDetector": ['url = "https://admin:Zq3xR8vN2m@example.com/api"'],
    "DiscordBotTokenDetector": ["MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs"],
    "GitHubTokenDetector": ['token = "ghp_Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA1b2c"'],
    "GitLabTokenDetector": ["glpat-Zq3xR8vN2mK7pL4wT9yB", "gldt-Zq3xR8vN2mK7pL4wT9yB", "glrt-Zq3xR8vN2mK7pL4wT9yB"],
    "IbmCloudIamDetector": ['ibm_cloud_iam_api_key = "Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA-Xe_Uo2Iu7Ya"'],
    "IbmCosHmacDetector": ['secret_access_key = "3f5a9c2e7b1d4086af2c9e3b7d1a5f0c4e8b2d6a9f1c3e5b"'],
    "JwtTokenDetector": [("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
                          "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")],
    "MailchimpDetector": ["3f5a9c2e7b1d4086af2c9e3b7d1a5f0c-us12"],
    "NpmDetector": ["//registry.npmjs.org/:_authToken=npm_Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA1b2c"],
    "OpenAIDetector": ["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"],
    "PrivateKeyDetector": ["-----BEGIN RSA PRIVATE KEY-----", "-----BEGIN OPENSSH PRIVATE KEY-----"],
    "PypiTokenDetector": ["pypi-AgEIcHlwaS5vcmc" + "Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sA" * 3],
    "SendGridDetector": ["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"],
    "SlackDetector": ["xoxb-1234567890-1234567890123-Zq3xR8vN2mK7pL4wT9yB6cJ1",
                      "https://hooks.slack.com/services/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"],
    "SquareOAuthDetector": ["sq0csp-Zq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sAZq3xR8v"],
    "StripeDetector": ["sk_live_Zq3xR8vN2mK7pL4wT9yB6cJ1", "rk_live_Zq3xR8vN2mK7pL4wT9yB6cJ1"],
    "TelegramBotTokenDetector": ["123456789:AAZq3xR8vN2mK7pL4wT9yB6cJ1hF5gD0sAZ"],
    "TwilioKeyDetector": ["AC3f5a9c2e7b1d4086af2c9e3b7d1a5f0c", "SK3f5a9c2e7b1d4086af2c9e3b7d1a5f0c"],
    "KeywordDetector": ['db_password = "Zq3xR8vN2mK7pL4w"', "API_KEY: Zq3xR8vN2mK7pL4wT9yB",
                        '"clientSecret": "Zq3xR8vN2mK7pL4wT9yB"', "export DB_PASSWD=Zq3xR8vN2mK7pL4w"],
}

ORDINARY = [
    "tokenizer = Tokenizer()",
    "password_field = forms.CharField()",
    'color = "#aabbcc"',
    'run_id = "123e4567-e89b-12d3-a456-426614174000"',
    'digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"',
    "SECRET_KEY = os.environ['SECRET_KEY']",
    'pad_token = "<|endoftext|>"',
    "num_tokens = embeddings.shape[0]",
    'DATABASE_URL = "postgres://${DB_USER}:${DB_PASSWORD}@db/app"',
    'TOKEN_FILE = "~/.config/dlm/token"',
    "max_tokens: int = 20_000_000",
]


@pytest.mark.parametrize("name", sorted(REPORTED))
def test_each_reported_shape_is_found_and_its_line_masked(name):
    line = REPORTED[name]
    assert secrets.find_secrets(line), name
    masked, count = secrets.mask_secrets(f"a = 1\n    {line}\nb = 2\n")
    assert (masked, count) == ("a = 1\n\nb = 2\n", 1)  # the line emptied, line numbers kept


@pytest.mark.parametrize("plugin", sorted(PLUGIN_EXAMPLES))
def test_detect_secrets_plugin_shapes_are_caught(plugin):
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings

    for example in PLUGIN_EXAMPLES[plugin]:
        with default_settings():
            found = list(scan_line(example))
        assert found, f"{example!r} is not a {plugin} secret for detect-secrets itself"
        assert secrets.contains_secret(example), f"{plugin}: {example!r} not caught"


def test_ordinary_code_is_not_masked():
    for line in ORDINARY:
        assert secrets.find_secrets(line) == [], line


def test_a_private_key_block_is_masked_to_its_end_line():
    text = "x = 1\nKEY = '''\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1b2c3d4e5f6\nq7r8s9t0\n" \
           "-----END RSA PRIVATE KEY-----\n'''\ny = 2\n"
    masked, count = secrets.mask_secrets(text)
    assert masked == "x = 1\nKEY = '''\n\n\n\n\n'''\ny = 2\n" and count == 4


def test_false_positives_on_this_repository_are_rare():
    """Every line of the repository's own Python source: the lines masked must be the test
    fixtures that hold secret shapes on purpose, nothing else."""
    lines = masked = 0
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith((".venv/", ".git/")) or "/site-packages/" in rel:
            continue
        text = path.read_text("utf-8", errors="replace")
        lines += text.count("\n") + 1
        if rel == "tests/lsp/test_secrets_never_leave.py":
            continue  # this file's examples are secrets on purpose
        masked += len(secrets.secret_lines(text))
    assert lines > 10_000
    assert masked / lines < 0.0005, (masked, lines)


def test_a_file_with_a_secret_keeps_its_other_lines_in_the_index(tmp_path):
    body = "import os\n\n" + "\n".join(REPORTED.values()) + "\n\ndef main():\n    return os.getcwd()\n"
    (tmp_path / "settings.py").write_text(body)
    src = discovery.read_source(str(tmp_path / "settings.py"), 1_000_000)
    assert isinstance(src, discovery.Source)  # masked, not refused
    assert src.text.splitlines() == ["import os", ""] + [""] * len(REPORTED) + ["", "def main():",
                                                                                 "    return os.getcwd()"]
    memory = RepoMemory()
    memory.update_file("settings.py", body)  # the raw text too: the memory masks at its entry point
    indexed = "".join(memory._strings[t] for t in memory._files["settings.py"])
    assert indexed == src.text
    buf = io.BytesIO()
    memory.save(buf)
    loaded = RepoMemory.load(io.BytesIO(buf.getvalue()))
    vocabulary = "\n".join(loaded._strings)
    assert "def main" in "".join(loaded._strings[t] for t in loaded._files["settings.py"])
    for needle in ("sk-proj-", "hf_Qm", "glpat-", "npm_Zq", "rk_live_", "hooks.slack", "ASIAZ", "Zq3xR8vN2mK7@"):
        assert needle not in vocabulary, needle
    assert discovery.check_text(body, 1_000_000) == ""  # a buffer is masked by the memory, not refused


def test_the_memory_never_proposes_another_files_secret():
    memory = RepoMemory()
    memory.update_file("config.py", f'import os\n\nHF_TOKEN = "{HF}"\nMODEL = "gpt2"\n')
    memory.update_file("other.py", 'MODEL = "gpt2"\nHF_TOKEN = "hf_short"\n')
    before = "import os\n\nHF_TOKEN = \""
    for open_files in (None, {"config.py": f'HF_TOKEN = "{HF}"\n'}):
        found = memory.complete(before, "", path="app.py", open_files=open_files)
        assert not any("hf_Qm" in c.text for c in found), found
    # nor a secret of this very document, seen above the cursor
    found = memory.complete(f'HF_TOKEN = "{HF}"\nOTHER_TOKEN = "', "", path="app.py")
    assert not any("hf_Qm" in c.text for c in found), found
    assert "hf_Qm" not in "".join(memory._strings)  # nor anything it counted on the way
    assert memory.complete(f'HF_TOKEN = "{HF}', "", path="app.py") == []  # a line holding one


def test_a_remote_prompt_on_the_wire_carries_no_secret():
    leak = REPORTED["huggingface"]
    region = "    value = compute()\n    x = "
    prompt = Prompt(
        prefix=f"import os\n{REPORTED['openai']}\n\ndef f():\n", region=region, cursor=len(region),
        suffix=f"\n{REPORTED['database_url']}\n", history=(f"--- a.py\n+++ a.py\n@@ -1 +1 @@\n+{leak}\n",),
        path="app.py", insert=True,
        proposals=(MemoryProposal(f'"{HF}"', 0.9), MemoryProposal("1", 0.5)),
        snippets=(RetrievedSnippet("config.py", f"MODEL = 'x'\n{leak}\n"),),
    )
    wire = decode_body(encode_frame(predict_message(7, prompt, SamplerParams()))[4:])
    flat = json.dumps(wire)
    for needle in ("sk-proj-", "hf_Qm", "Zq3xR8vN2mK7@"):
        assert needle not in flat, needle
    sent = wire["prompt"]
    assert sent["proposals"] == [["1", 0.5]]
    assert sent["snippets"] == [["config.py", "MODEL = 'x'\n\n"]]
    assert sent["prefix"] == "import os\n\n\ndef f():\n"
    assert (sent["region"], sent["cursor"]) == (region, len(region))
    # a region line holding a secret is emptied and the cursor keeps its place after it
    own = Prompt(prefix="", region=f"{leak}\nx = ", cursor=len(leak) + 5, suffix="")
    sent = decode_body(encode_frame(predict_message(8, own, SamplerParams()))[4:])["prompt"]
    assert (sent["region"], sent["cursor"]) == ("\nx = ", 5)


def test_the_remote_client_asks_nothing_for_a_region_holding_a_secret():
    from dlm.coder_model.remote.client import RemoteEngine
    from dlm.coder_model.types import CancelToken

    engine = RemoteEngine.__new__(RemoteEngine)  # no connection: predict must stop before the wire
    engine._session = object()
    prompt = Prompt(prefix="", region=REPORTED["huggingface"], cursor=3, suffix="")
    assert engine.predict(prompt, SamplerParams(), CancelToken()).text == ""


class _EchoEngine:
    """Answers the region with `insertion` at the cursor."""

    def __init__(self, insertion: str):
        from dlm.coder_model.types import LayoutBudget

        self.insertion = insertion
        self.budget = LayoutBudget()

    def predict(self, prompt, params, cancel, deadline=None):
        text = prompt.region[: prompt.cursor] + self.insertion + prompt.region[prompt.cursor :]
        return Prediction(text=text, confidence=1.0, steps=1, tokens=3)

    def submit(self, prompt, params, cancel, deadline=None) -> Future:
        return on_a_thread(self.predict, prompt, params, cancel, deadline)


@pytest.mark.parametrize(("insertion", "shown"), [(f'"{HF}"', False), ('"gpt2"', True)])
def test_the_http_endpoint_answer_carries_no_secret(insertion, shown):
    from dlm.lsp import http_endpoint as he

    predictor = he.Predictor(he.EngineHolder(lambda: None), he.EndpointOptions(deadline_ms=600_000,
                                                                              min_confidence=0.0))
    predictor.engine = lambda: _EchoEngine(insertion)
    body = json.dumps({"model": "dlm", "prompt": "<|fim_prefix|>import os\nHF_TOKEN = <|fim_suffix|>\n"
                       "<|fim_middle|>", "max_tokens": 32, "stop": []}).encode()
    answer = predictor.complete(he.parse_request(body, 100_000))
    text = answer["choices"][0]["text"]
    assert "hf_" not in text
    assert (text == insertion) is shown

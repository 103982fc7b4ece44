"""A hosted engine's settings: where they may come from, what is refused, and the key's rules
(coder_model.hosted.settings; docs/engines.md "Security and privacy")."""

from __future__ import annotations

import argparse
import os
import pickle

import pytest
from dlm.coder_model.hosted import settings as hs
from dlm.coder_model.hosted.settings import EngineSettings, EngineSettingsError

KEY = "sk-test-0123456789abcdef"


def test_defaults_fill_in_and_mercury_goes_to_inception():
    s = EngineSettings(kind="mercury-edit").resolved()
    assert s.url == hs.INCEPTION_URL and s.host == hs.INCEPTION_HOST and s.model == "mercury-edit-2"
    assert s.deadline_ms > 250 and s.max_tokens > 0 and s.budget.max_context == s.context_tokens


@pytest.mark.parametrize("url, why", [
    ("http://gpu-box.example.com:8000", "plain http"),
    ("http://10.0.0.5:8000", "plain http"),
    ("https://user:pw@host.example.com", "user name or password"),
    ("https://host.example.com/v1?key=x", "query"),
    ("ftp://host.example.com", "http"),
    ("not a url", "http"),
])
def test_urls_that_would_leak_or_are_not_http_are_refused(url, why):
    with pytest.raises(EngineSettingsError, match=why):
        EngineSettings(kind="openai-fim", url=url).resolved()


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://localhost:11434", "http://[::1]:8080",
                                 "https://models.example.com/v1"])
def test_loopback_http_and_any_https_are_taken(url):
    assert EngineSettings(kind="openai-fim", url=url).resolved().url == url


def test_an_inception_key_goes_only_to_inception_unless_the_user_names_the_host():
    env = {"INCEPTION_API_KEY": KEY}
    key = hs.load_key(EngineSettings(kind="mercury-edit").resolved(), env)
    assert key is not None and key.authorization() == f"Bearer {KEY}"
    proxy = EngineSettings(kind="mercury-edit", url="https://proxy.example.com").resolved()
    with pytest.raises(EngineSettingsError, match="only to api.inceptionlabs.ai"):
        hs.load_key(proxy, env)
    assert hs.load_key(EngineSettings(kind="mercury-edit", url="https://proxy.example.com",
                                      key_host="proxy.example.com").resolved(), env) is not None
    # the Inception variable with another kind is still an Inception key
    local = EngineSettings(kind="openai-fim", url="http://127.0.0.1:8000", api_key_env="INCEPTION_API_KEY")
    with pytest.raises(EngineSettingsError, match="only to api.inceptionlabs.ai"):
        hs.load_key(local.resolved(), env)


def test_a_generic_server_gets_a_key_only_for_the_host_named_and_none_by_default():
    assert hs.load_key(EngineSettings(kind="openai-fim", url="http://127.0.0.1:8000").resolved(), {}) is None
    named = EngineSettings(kind="openai-fim", url="http://127.0.0.1:8000", api_key_env="MY_KEY")
    with pytest.raises(EngineSettingsError, match="keyHost"):
        hs.load_key(named.resolved(), {"MY_KEY": KEY})
    ok = EngineSettings(kind="openai-fim", url="http://127.0.0.1:8000", api_key_env="MY_KEY", key_host="127.0.0.1")
    assert hs.load_key(ok.resolved(), {"MY_KEY": KEY}) is not None


def test_a_missing_key_says_which_variable_to_set():
    with pytest.raises(EngineSettingsError, match="INCEPTION_API_KEY"):
        hs.load_key(EngineSettings(kind="mercury-fim").resolved(), {})


def test_a_key_file_must_be_the_users_alone(tmp_path):
    f = tmp_path / "key"
    f.write_text(KEY + "\n")
    os.chmod(f, 0o644)
    s = EngineSettings(kind="mercury-edit", api_key_file=str(f)).resolved()
    with pytest.raises(EngineSettingsError, match="chmod 600"):
        hs.load_key(s, {})
    os.chmod(f, 0o600)
    assert hs.load_key(s, {}).authorization() == f"Bearer {KEY}"
    link = tmp_path / "link"
    link.symlink_to(f)
    with pytest.raises(EngineSettingsError, match="cannot read"):
        hs.load_key(EngineSettings(kind="mercury-edit", api_key_file=str(link)).resolved(), {})


def test_the_key_never_shows_in_its_repr_and_is_never_pickled():
    key = hs.ApiKey(KEY, "$INCEPTION_API_KEY")
    assert KEY not in repr(key) and KEY not in str(key) and KEY not in f"{key}"
    assert key.mask(f"server said: bad key {KEY}") == "server said: bad key <key from $INCEPTION_API_KEY>"
    with pytest.raises(TypeError):
        pickle.dumps(key)
    s = EngineSettings(kind="mercury-edit", api_key_env="INCEPTION_API_KEY")
    assert KEY not in repr(s)  # the settings hold where the key comes from, never the key


def test_only_a_user_scoped_engine_from_initialization_options_is_taken():
    engine = {"kind": "openai-fim", "url": "http://127.0.0.1:9"}
    for value in (engine, {**engine, "scope": "workspace"}, {**engine, "scope": None}):
        found = hs.from_initialization_options(value)
        assert found.settings is None and "workspace were ignored" in found.note and not found.problem
    found = hs.from_initialization_options({**engine, "scope": "user", "deadlineMs": 900, "maxTokens": 32.0})
    assert found.settings is not None and found.settings.kind == "openai-fim"
    assert found.settings.deadline_ms == 900 and found.settings.max_tokens == 32
    assert "user settings" in found.settings.source
    assert hs.from_initialization_options({**engine, "scope": "machine"}).settings is not None
    # a client whose settings merge the project's with the user's cannot vouch for the mark
    assert hs.from_initialization_options({**engine, "scope": "user"}, "Neovim").settings is not None
    found = hs.from_initialization_options({**engine, "scope": "user"}, "Zed")
    assert found.settings is None and "command line alone" in found.note


def test_a_user_scoped_engine_with_a_problem_says_it_and_is_not_replaced():
    found = hs.from_initialization_options({"kind": "openai-fim", "url": "http://10.1.2.3:80", "scope": "user"})
    assert found.settings is None and "plain http" in found.problem
    found = hs.from_initialization_options({"kind": "openai-fim", "url": 5, "scope": "user"})
    assert found.settings is None and "engine.url must be text" in found.problem
    found = hs.from_initialization_options({"kind": "ollama", "url": "http://127.0.0.1:1", "scope": "user",
                                            "colour": "red"})
    assert "model" in found.problem and "colour" in found.note


def test_the_command_line_gives_the_same_settings_and_passes_them_on():
    parser = argparse.ArgumentParser()
    hs.add_engine_arguments(parser)
    args = parser.parse_args(["--engine", "openai-fim", "--engine-url", "http://127.0.0.1:8765",
                              "--engine-context-tokens", "384", "--engine-key-env", "MY_KEY"])
    s = hs.settings_from_args(args)
    assert (s.kind, s.url, s.context_tokens, s.api_key_env) == ("openai-fim", "http://127.0.0.1:8765", 384, "MY_KEY")
    again = hs.settings_from_args(parser.parse_args(hs.engine_argv(args)))
    assert again == s
    assert hs.settings_from_args(parser.parse_args([])) is None
    with pytest.raises(EngineSettingsError, match="need --engine"):
        hs.settings_from_args(parser.parse_args(["--engine-url", "http://127.0.0.1:1"]))


def test_the_language_server_and_the_settings_import_no_http_client_and_no_torch():
    import subprocess
    import sys

    code = ("import sys, dlm.lsp.server_cli, dlm.lsp.server, dlm.coder_model.hosted.settings, "
            "dlm.coder_model.hosted.prompts; assert 'httpx' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

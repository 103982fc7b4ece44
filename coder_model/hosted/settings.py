"""A hosted engine's settings (docs/engines.md): what the user chose, what is refused, and its key.

Where they come from: the command line (`dlm-lsp --stdio --engine KIND --engine-url URL ...`, the
same on `predict`, `bench` and `eval`), or initializationOptions["engine"] only when the client
marks the object `"scope": "user"` (or "machine"): a project can set initializationOptions
(.vscode/settings.json, .zed/settings.json, a Neovim exrc), and the engine decides where the
user's code goes and which credential goes with it, so an object without that mark is ignored
and dlm/status says so (`from_initialization_options`).

What is refused, in words: an unknown kind; a URL that is not http(s), holds a user name,
password, query or fragment, or is plain http:// to another machine; a key that would go to a host
that is not its vendor's (an Inception key goes only to api.inceptionlabs.ai) unless `keyHost`
names that host; a key file others can read. The key itself is never a setting: it comes from an
environment variable (`apiKeyEnv`, by default the kind's, e.g. INCEPTION_API_KEY) or a file of
mode 0600 (`apiKeyFile`), and `ApiKey` never shows it (repr, str, logs, status, errors).

Nothing here imports an HTTP client: the language server reads these settings before, and
without, making an engine.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import stat
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import urlsplit

from dlm.coder_model.types import LayoutBudget

INCEPTION_URL = "https://api.inceptionlabs.ai"
INCEPTION_HOST = "api.inceptionlabs.ai"
INCEPTION_KEY_ENV = "INCEPTION_API_KEY"
USER_SCOPES = ("user", "machine")
# Clients whose shipped plugin marks the engine user-scoped from the user's own settings (clientInfo.name):
# the VS Code extension (VS Code and its builds, `env.appName`) and the Neovim plugin. Other clients
# (Zed, Helix, Emacs) send initializationOptions merged from the user's and the project's settings,
# where a project could write the mark too: there the engine comes from the command line alone.
USER_SCOPE_CLIENTS = frozenset({
    "Visual Studio Code", "Visual Studio Code - Insiders", "VSCodium", "VSCodium - Insiders", "Code - OSS",
    "code-server", "Cursor", "Windsurf", "Positron", "Neovim",
})
# The memory's draft answers without asking the backend when its own confidence (the memory's side
# of coder_model.proposal_mix) is at least this: on xarray's held-out lines the memory alone is
# 70.6% precise at 0.7 (BENCHMARKS.md "Repository memory through the server").
MEMORY_FIRST = 0.7
MAX_KEY_FILE_BYTES = 4096
# Which host the key of a well-known variable belongs to (a key goes nowhere else without keyHost).
KEY_VENDORS = {INCEPTION_KEY_ENV: INCEPTION_HOST}


@dataclass(frozen=True)
class Kind:
    """A kind's defaults and what it needs."""

    url: str  # the base URL ('' : the user names it)
    model: str  # the model sent ('' : none, unless the user names one)
    needs_model: bool
    key_env: str  # the variable its key is read from by default ('' : no key unless configured)
    vendor: str  # how messages name the backend
    deadline_ms: int  # the answer's deadline, from the keystroke: remote models take longer
    context_tokens: int  # the budget of the text windows (coder_model.budget)
    max_tokens: int


KINDS: dict[str, Kind] = {
    "mercury-edit": Kind(INCEPTION_URL, "mercury-edit-2", True, INCEPTION_KEY_ENV, "Inception API", 1500, 256, 512),
    "mercury-fim": Kind(INCEPTION_URL, "mercury-coder", True, INCEPTION_KEY_ENV, "Inception API", 1500, 1024, 128),
    "openai-fim": Kind("", "", False, "", "the completions server", 2000, 1024, 128),
    "llamacpp-infill": Kind("http://127.0.0.1:8080", "", False, "", "llama.cpp", 2000, 1024, 128),
    "ollama": Kind("http://127.0.0.1:11434", "", True, "", "Ollama", 3000, 1024, 128),
}
# Ranges of the numbers a user sets: (low, high).
RANGES: dict[str, tuple[float, float]] = {
    "deadline_ms": (50, 60_000), "max_tokens": (1, 4096), "context_tokens": (64, 131_072), "memory_first": (0.0, 1.0),
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_HOST = re.compile(r"[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]+\]")
_KEY = re.compile(r"[\x21-\x7e]{8,4096}")  # printable ASCII, no blank: nothing that breaks a header


class EngineSettingsError(ValueError):
    """The settings cannot make an engine; the message says what to change."""


@dataclass(frozen=True)
class EngineSettings:
    """What the user chose (docs/engines.md has each field). 0 and '' take the kind's default;
    `resolved()` fills them in and checks everything."""

    kind: str
    url: str = ""
    model: str = ""
    api_key_env: str = ""
    api_key_file: str = ""
    key_host: str = ""  # another host the key may go to, named by the user
    deadline_ms: int = 0
    max_tokens: int = 0
    context_tokens: int = 0
    memory_first: float = MEMORY_FIRST
    source: str = "the command line"  # where these came from, for messages

    @property
    def defaults(self) -> Kind:
        return KINDS[self.kind]

    @property
    def host(self) -> str:
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def endpoint(self, path: str) -> str:
        """The URL of an endpoint path ("/v1/completions"): the base URL and the path, once (a base
        URL given as ".../v1", as OpenAI-compatible servers are often named, keeps one /v1)."""
        base = self.base_url
        if base.endswith("/v1") and path.startswith("/v1/"):
            base = base[: -len("/v1")]
        return base + path

    @property
    def budget(self) -> LayoutBudget:
        return LayoutBudget.for_window(self.context_tokens or self.defaults.context_tokens)

    @property
    def key_source(self) -> str:
        """Where the key comes from, in words ('' : no key)."""
        if self.api_key_file:
            return f"the file {self.api_key_file}"
        env = self.api_key_env or self.defaults.key_env
        return f"${env}" if env else ""

    def describe(self) -> str:
        """One line for logs and the status: the kind, host and model; never the key."""
        model = f" {self.model}" if self.model else ""
        return f"{self.kind}{model} at {self.host or self.url}"

    def resolved(self) -> EngineSettings:
        """The settings with the kind's defaults filled in, checked; EngineSettingsError says what
        to change."""
        if self.kind not in KINDS:
            raise EngineSettingsError(f"engine kind {self.kind!r} is not one of {', '.join(KINDS)}")
        d = KINDS[self.kind]
        s = replace(self, url=(self.url or d.url).strip(), model=(self.model or d.model).strip(),
                    deadline_ms=self.deadline_ms or d.deadline_ms, max_tokens=self.max_tokens or d.max_tokens,
                    context_tokens=self.context_tokens or d.context_tokens, key_host=self.key_host.strip().lower())
        if not s.url:
            raise EngineSettingsError(f"engine kind {s.kind} needs a URL: the server's address, e.g. "
                                      "http://127.0.0.1:8000 (engine.url, --engine-url)")
        check_url(s.url)
        if s.needs_model_missing():
            raise EngineSettingsError(f"engine kind {s.kind} needs a model name (engine.model, --engine-model)")
        if len(s.model) > 200 or any(ord(ch) < 32 for ch in s.model):
            raise EngineSettingsError("engine.model must be a name of at most 200 printable characters")
        if s.api_key_env and not _ENV_NAME.fullmatch(s.api_key_env):
            raise EngineSettingsError(f"engine.apiKeyEnv {s.api_key_env[:60]!r} is not an environment variable's "
                                      "name (letters, digits and _)")
        if s.api_key_env and s.api_key_file:
            raise EngineSettingsError("give one of engine.apiKeyEnv and engine.apiKeyFile, not both")
        if s.key_host and not _HOST.fullmatch(s.key_host):
            raise EngineSettingsError(f"engine.keyHost {s.key_host[:60]!r} is not a host name")
        for name, (low, high) in RANGES.items():
            value = getattr(s, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise EngineSettingsError(f"engine.{_camel(name)}={value!r} is outside [{low:g}, {high:g}]")
        return s

    def needs_model_missing(self) -> bool:
        return self.defaults.needs_model and not self.model

    def key_host_problem(self) -> str:
        """Why the key may not go to this URL's host ('' when it may): a key goes to its vendor's
        host (by the kind, or by a well-known variable), or to the host `keyHost` names."""
        host = self.host
        if self.key_host and self.key_host == host:
            return ""
        env = "" if self.api_key_file else (self.api_key_env or self.defaults.key_env)
        vendor = KEY_VENDORS.get(env) or (INCEPTION_HOST if self.kind.startswith("mercury") else "")
        if vendor and vendor == host:
            return ""
        where = f"only to {vendor}" if vendor else "to no host unless engine.keyHost names it"
        return (f"the key from {self.key_source} goes {where}, not to {host}: set engine.keyHost to {host!r} in "
                f"your user settings (or --engine-key-host {host}) to send it there")


def check_url(url: str) -> None:
    """EngineSettingsError when `url` may not be used (module docstring)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EngineSettingsError(f"engine.url {url[:100]!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineSettingsError(f"engine.url {url[:100]!r}: use http(s)://HOST[:PORT][/PATH]")
    if parts.username is not None or parts.password is not None:
        raise EngineSettingsError("engine.url holds a user name or password: put the key in an environment "
                                  "variable (engine.apiKeyEnv) or a 0600 file (engine.apiKeyFile) instead")
    if parts.query or parts.fragment:
        raise EngineSettingsError(f"engine.url {url[:100]!r}: leave out the query and fragment")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise EngineSettingsError(f"engine.url {url[:100]!r}: plain http:// is refused to another machine (the code "
                                  "and the key would cross the network in the clear); use https://, or an SSH "
                                  "tunnel to 127.0.0.1")
    if port == 0:
        raise EngineSettingsError(f"engine.url {url[:100]!r}: port 0 is no port")


def is_loopback(host: str) -> bool:
    """A loopback address or `localhost`, by its text alone (no DNS: a name may resolve elsewhere later)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiKey:
    """A key, kept out of every text: repr and str name only where it came from."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def __repr__(self) -> str:
        return f"<key from {self.source}>"

    __str__ = __repr__

    def __reduce__(self):  # never pickled into a cache, a crash dump or another process
        raise TypeError("an API key is not pickled")

    def authorization(self) -> str:
        return f"Bearer {self._value}"

    def mask(self, text: str) -> str:
        """`text` with the key replaced by its source (for messages built from what a server said)."""
        return text.replace(self._value, repr(self)) if self._value else text


def load_key(s: EngineSettings, env: dict[str, str] | None = None) -> ApiKey | None:
    """The key of resolved settings `s`: from the file, else the variable; None when the kind needs
    none and none is configured. EngineSettingsError when it is missing, unreadable, readable by
    others, malformed, or would go to a host it may not (`key_host_problem`)."""
    env = os.environ if env is None else env
    name = s.api_key_env or ("" if s.api_key_file else s.defaults.key_env)
    if s.api_key_file:
        value = _read_key_file(os.path.expanduser(s.api_key_file))
    else:
        value = env.get(name, "").strip() if name else ""
        if not value:
            if s.api_key_env or s.kind.startswith("mercury"):
                raise EngineSettingsError(f"{s.defaults.vendor}: no key: set {name} in the environment the editor "
                                          "starts dlm-lsp with, or give engine.apiKeyFile (a 0600 file)")
            return None
    if not _KEY.fullmatch(value):
        raise EngineSettingsError(f"the key from {s.key_source} is not one line of 8 or more printable characters")
    problem = s.key_host_problem()
    if problem:
        raise EngineSettingsError(problem)
    return ApiKey(value, s.key_source)


def _read_key_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise EngineSettingsError(f"cannot read the key file {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise EngineSettingsError(f"the key file {path} is not a regular file")
        if os.name == "posix":
            if st.st_uid != os.geteuid():
                raise EngineSettingsError(f"the key file {path} belongs to another user; use a file of your own")
            if st.st_mode & 0o077:
                raise EngineSettingsError(f"the key file {path} can be read by others: run `chmod 600 {path}`")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise EngineSettingsError(f"the key file {path} is over {MAX_KEY_FILE_BYTES} bytes: it holds more than a key")
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise EngineSettingsError(f"the key file {path} is not ASCII text") from None


# -- initializationOptions ------------------------------------------------------------------------

_OPTION_NAMES = {f.name for f in fields(EngineSettings)} - {"source"}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


@dataclass(frozen=True)
class FromOptions:
    """What initializationOptions["engine"] asks for."""

    settings: EngineSettings | None = None  # a user-scoped engine, resolved: the server makes it
    note: str = ""  # what dlm/status says about the value ('' : nothing to say)
    problem: str = ""  # a user-scoped engine that cannot be made: no suggestions, and this says why


def from_initialization_options(value: Any, client: str | None = None) -> FromOptions:
    """The engine initializationOptions["engine"] names, taken only when the client marked it
    user-scoped (module docstring) and, when `client` (clientInfo.name) is given, only from a
    client whose plugin sets that mark (USER_SCOPE_CLIENTS); an ignored value says why in `note`."""
    if value is None:
        return FromOptions()
    if not isinstance(value, dict):
        return FromOptions(note="initializationOptions.engine ignored: it is not an object; the embedded model answers")
    if client is not None and client not in USER_SCOPE_CLIENTS:
        return FromOptions(note=f"engine settings from initializationOptions were ignored: {client[:40] or 'a client'} "
                                "sends your settings and the project's together, so the engine is taken from the "
                                "command line alone there (dlm-lsp --stdio --engine KIND ... in your user "
                                "configuration); the embedded model answers")
    scope = value.get("scope")
    if scope not in USER_SCOPES:
        return FromOptions(note='engine settings from the workspace were ignored: initializationOptions.engine came '
                                'without "scope": "user" (a project can set initializationOptions), and the engine '
                                "is chosen only in your user settings or on the command line; the embedded model "
                                "answers")
    kwargs: dict[str, Any] = {"source": f"your {scope} settings"}
    unknown = []
    for key, item in value.items():
        name = _snake(str(key))
        if name == "scope":
            continue
        if name not in _OPTION_NAMES:
            unknown.append(str(key)[:40])
            continue
        expected = (int, float) if name in RANGES else str
        if isinstance(item, bool) or not isinstance(item, expected):
            return FromOptions(problem=f"engine.{str(key)[:40]} must be {'a number' if name in RANGES else 'text'}; "
                                       "no suggestions until your engine settings are fixed")
        kwargs[name] = int(item) if isinstance(item, float) and item.is_integer() and name != "memory_first" else item
    if not kwargs.get("kind"):
        return FromOptions(problem=f"engine.kind is missing: use one of {', '.join(KINDS)}; no suggestions until "
                                   "your engine settings are fixed")
    note = f"unknown engine settings ignored: {', '.join(unknown)}" if unknown else ""
    try:
        return FromOptions(EngineSettings(**kwargs).resolved(), note)
    except EngineSettingsError as exc:
        return FromOptions(note=note, problem=f"{exc}; no suggestions until your engine settings are fixed")


# -- the command line -----------------------------------------------------------------------------


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """--engine KIND and its settings (docs/engines.md); the same on `--stdio`, predict, bench, eval."""
    group = parser.add_argument_group("hosted engine (docs/engines.md)")
    group.add_argument("--engine", dest="engine_kind", metavar="KIND", choices=tuple(KINDS),
                       help=f"a model behind an HTTP API instead of the embedded one: {', '.join(KINDS)}")
    group.add_argument("--engine-url", metavar="URL", help="the server's base URL (default: the kind's)")
    group.add_argument("--engine-model", metavar="NAME", help="the model to ask for (default: the kind's)")
    key = group.add_mutually_exclusive_group()
    key.add_argument("--engine-key-env", metavar="VAR", help="the environment variable holding the key "
                     f"(default: the kind's, {INCEPTION_KEY_ENV} for Inception)")
    key.add_argument("--engine-key-file", metavar="FILE", help="a file of mode 0600 holding the key")
    group.add_argument("--engine-key-host", metavar="HOST", help="another host the key may be sent to")
    group.add_argument("--engine-deadline-ms", type=int, metavar="MS", help="the answer's deadline (default: the kind's)")
    group.add_argument("--engine-max-tokens", type=int, metavar="N", help="tokens the backend may write")
    group.add_argument("--engine-context-tokens", type=int, metavar="N",
                       help="the token budget of the text windows sent (default: the kind's)")


ARG_FIELDS = {"engine_url": "url", "engine_model": "model", "engine_key_env": "api_key_env",
              "engine_key_file": "api_key_file", "engine_key_host": "key_host", "engine_deadline_ms": "deadline_ms",
              "engine_max_tokens": "max_tokens", "engine_context_tokens": "context_tokens"}


def settings_from_args(args: argparse.Namespace) -> EngineSettings | None:
    """The command line's engine settings (unresolved), or None without --engine."""
    kind = getattr(args, "engine_kind", None)
    if not kind:
        if any(getattr(args, a, None) for a in ARG_FIELDS):
            raise EngineSettingsError("--engine-url and the other --engine-* options need --engine KIND")
        return None
    kwargs = {f: getattr(args, a) for a, f in ARG_FIELDS.items() if getattr(args, a, None) is not None}
    return EngineSettings(kind=kind, **kwargs)


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The --engine options of `args` again, for a server a driver starts (bench, eval)."""
    kind = getattr(args, "engine_kind", None)
    if not kind:
        return []
    out = ["--engine", kind]
    for a in ARG_FIELDS:
        value = getattr(args, a, None)
        if value is not None:
            out += ["--" + a.replace("_", "-"), str(value)]
    return out

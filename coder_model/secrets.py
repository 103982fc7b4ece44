"""Secrets in text: found line by line, masked before they are indexed, proposed or sent.

What counts as a secret (pure Python, compiled regular expressions only):

- well-known token shapes, by their fixed prefixes: AWS access key ids (AKIA, ASIA,
  ABIA, ACCA, A3T...), GitHub (ghp_, gho_, ghu_, ghs_, ghr_, github_pat_), GitLab
  (glpat-, gldt-, glrt-, glft-, glsoat-, glcbt-, glimt-, glptt-, glagent-, gloas-,
  GR1348941 runner tokens), Slack (xoxa/b/p/o/s/r- tokens, xapp-, incoming
  webhook URLs), OpenAI (sk-proj-, sk-svcacct-, sk-admin-, legacy sk- keys),
  Anthropic (sk-ant-), Hugging Face (hf_), npm (npm_, `:_authToken=` in .npmrc),
  PyPI upload tokens (pypi-AgEI...), Stripe (sk_/rk_/pk_ live and test keys),
  SendGrid (SG.x.y), Twilio (AC/SK ids), Mailchimp (...-usN), Square (sq0csp-,
  sq0atp-, EAAA...), Discord bot tokens, Telegram bot tokens, Google API keys
  (AIza...), Azure storage account keys (AccountKey=, SharedAccessKey=), JSON web
  tokens (eyJ...eyJ...), Artifactory API keys (AKCp...), private key blocks
  (`-----BEGIN ... PRIVATE KEY-----` up to its END line, PuTTY key files);
- credentials in URLs: `scheme://user:password@host` (database URLs, basic auth),
  unless the password is a placeholder (`${VAR}`, `{password}`, `<pass>`, `%s`, `***`);
- a value assigned to a secret-looking name (a name whose last word is key, token,
  secret, password, passwd, pwd, pass, credentials, auth...; or holding password /
  passwd / secret / apikey / credentials anywhere; any case, snake or camel) when the
  value has 16 to 512 characters, no blank, at least one digit, and a Shannon entropy
  of at least ENTROPY_HEX bits per character (hex values) or ENTROPY bits (others).
  Assignment shapes: `NAME = "..."`, `NAME: str = '...'`, `NAME := "..."`, `name: ...`
  (YAML), `NAME=...` (.env, shell), `"name": "..."` (JSON), `name => "..."`,
  `os.environ["NAME"] = "..."`, `apiKey: "..."`.

What is not detected: secrets without a known prefix whose name says nothing (a bare
random string in a list), low-entropy or digit-free passwords (`hunter2`,
`correcthorsebatterystaple`), values split across lines or built by concatenation,
and encodings of secrets (base64 of a token). Hashes, UUIDs, colours and other
identifiers are not secrets unless a secret-looking name is assigned one.

Masking replaces the WHOLE line holding a secret by an empty line (its line break is
kept, nothing else): line numbers and every other line stay exactly as they were, no
placeholder text enters the n-gram counts, and no half-masked line keeps a prefix of
a secret. A private key block is masked from its BEGIN line to its END line.

Lines are split as the repository memory's lexer splits them (\\r\\n, \\n, \\r).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

ENTROPY = 3.3  # bits per character, a value of mixed letters and digits
ENTROPY_HEX = 3.0  # bits per character, a value of hex digits only (16 symbols at most)
MIN_VALUE_CHARS = 16
MAX_VALUE_CHARS = 512
MAX_KEY_BLOCK_LINES = 200  # a private key block is masked up to its END line, at most this many lines


@dataclass(frozen=True, slots=True)
class Span:
    """A secret found in a line: its offsets in that line and what it looks like."""

    start: int
    end: int
    kind: str


# Token shapes with a fixed prefix. Every alternative starts with one literal character (the
# regex engine then skips other characters fast and tries only the alternatives of the one it
# meets); `_B` right after it says that no word character comes before it. Every quantifier is
# bounded and no two adjacent ones overlap ambiguously: a search is linear in the text.
_B = r"(?<![A-Za-z0-9_].)"
_END = r"(?![A-Za-z0-9_-])"
_SHAPES: tuple[tuple[str, str], ...] = (
    ("private_key", r"-----BEGIN (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----"),
    ("private_key", r"P" + _B + r"uTTY-User-Key-File-\d"),
    ("aws_access_key_id", r"A" + _B + r"(?:3T[A-Z0-9]|KIA|SIA|BIA|CCA)[0-9A-Z]{16}\b"),
    *(("aws_secret_access_key",
       c + _B + r"(?i:ws[\w.-]{0,20}?(?:key|pwd|pw|password|pass|token|secret)[\w\"'\]]{0,20}?\s{0,4}[:=]{1,2}>?"
       r"\s{0,4}[\"'][0-9a-zA-Z/+]{40}[\"'])") for c in "aA"),
    ("github_token", r"g" + _B + r"h[pousr]_[A-Za-z0-9_]{36,255}" + _END),
    ("github_token", r"g" + _B + r"ithub_pat_[A-Za-z0-9_]{22,255}" + _END),
    ("gitlab_token", r"g" + _B + r"l(?:pat|dt|rt|ft|soat|cbt|imt|ptt|agent|oas)-[A-Za-z0-9_-]{20,1024}" + _END),
    ("gitlab_token", r"G" + _B + r"R1348941[A-Za-z0-9_-]{20,50}" + _END),
    ("slack_token", r"x" + _B + r"ox[abposre]-[A-Za-z0-9-]{10,250}"),
    ("slack_token", r"x" + _B + r"app-\d-[A-Za-z0-9-]{10,250}"),
    ("slack_webhook", r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{16,300}"),
    ("openai_key", r"s" + _B + r"k-(?:(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,300}"
     r"|[A-Za-z0-9_-]{0,100}T3BlbkFJ[A-Za-z0-9_-]{20,100}|[A-Za-z0-9]{32,100}" + _END + ")"),
    ("anthropic_key", r"s" + _B + r"k-ant-[A-Za-z0-9_-]{20,300}"),
    ("huggingface_token", r"h" + _B + r"f_[A-Za-z0-9]{30,60}" + _END),
    ("npm_token", r"n" + _B + r"pm_[A-Za-z0-9]{36}" + _END),
    ("npm_token", r":_authToken\s{0,4}=\s{0,4}[^\s$\"'{]\S{7,500}"),
    ("pypi_token", r"p" + _B + r"ypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{50,2000}"),
    *(("stripe_key", c + _B + r"k_(?:live|test)_[0-9A-Za-z]{16,255}" + _END) for c in "srp"),
    ("sendgrid_key", r"S" + _B + r"G\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}" + _END),
    ("twilio_key", r"A" + _B + r"C(?=[a-z]{0,31}\d)[a-z0-9]{32}\b"),
    ("twilio_key", r"S" + _B + r"K(?=[a-z]{0,31}\d)[a-z0-9]{32}\b"),
    # the 32 characters before "-us" are looked behind: the span is widened to them afterwards
    ("mailchimp_key", r"-(?<=(?<![A-Za-z0-9_])[0-9a-z]{32}-)us\d{1,2}\b"),
    ("square_token", r"s" + _B + r"q0(?:csp|atp|idp)-[0-9A-Za-z_\\-]{22,43}"),
    ("square_token", r"E" + _B + r"AAA[A-Za-z0-9_-]{60}" + _END),
    *(("discord_token", c + _B + r"[A-Za-z\d_-]{23,25}\.[A-Za-z\d_-]{6}\.[A-Za-z\d_-]{27,38}" + _END)
      for c in "MNO"),
    # the bot id's digits before ":" are looked behind, and the span widened to them afterwards
    ("telegram_token", r":(?:(?<=(?<![A-Za-z0-9_])\d{8}:)|(?<=(?<![A-Za-z0-9_])\d{9}:)|(?<=(?<![A-Za-z0-9_])\d{10}:))"
     r"[0-9A-Za-z_-]{35}" + _END),
    ("google_api_key", r"A" + _B + r"Iza[0-9A-Za-z_-]{35}" + _END),
    ("azure_storage_key", r"A" + _B + r"ccountKey\s{0,2}=\s{0,2}[A-Za-z0-9+/]{40,100}={0,2}"),
    ("azure_storage_key", r"S" + _B + r"haredAccessKey\s{0,2}=\s{0,2}[A-Za-z0-9+/]{40,100}={0,2}"),
    ("jwt", r"e" + _B + r"yJ[A-Za-z0-9_-]{5,2000}\.eyJ[A-Za-z0-9_-]{5,4000}\.[A-Za-z0-9_-]{0,2000}"),
    ("artifactory_key", r"A" + _B + r"KCp[0-9A-Za-z]{60,80}\b"),
)
# The group of each alternative opens after its first character (a group first would hide the
# literal from the engine's fast path); the span is the whole match.
_SHAPE_RE = re.compile("|".join(f"{rx[0]}(?P<s{i}>{rx[1:]})" for i, (_, rx) in enumerate(_SHAPES)))
_SHAPE_KIND = {f"s{i}": kind for i, (kind, _) in enumerate(_SHAPES)}
_WIDEN = {"mailchimp_key": re.compile(r"[0-9a-z]{32}\Z"), "telegram_token": re.compile(r"\d{8,10}\Z")}


def _shape_spans(line: str) -> list[Span]:
    out = []
    for m in _SHAPE_RE.finditer(line):
        kind = _SHAPE_KIND[m.lastgroup or ""]
        start = m.start()
        widen = _WIDEN.get(kind)
        if widen is not None:
            w = widen.search(line, max(0, start - 10 - 32), start)
            start = w.start() if w is not None else start
        out.append(Span(start, m.end(), kind))
    return out


# scheme://user:password@host. The password group stops at the first '@', '/', blank or quote.
_URL_CREDENTIALS = re.compile(
    r"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s:/?#@\"'`<>]{1,128}:(?P<pw>[^\s/?#@\"'`<>]{1,256})@[^\s/?#@\"'`<>]"
)
_PLACEHOLDER = re.compile(r"[$%{<\[(*]|\A(?:x+|\.+|(?:my|your)?(?:pass(?:word|wd)?|pwd|secret|token)|changeme)\Z",
                          re.IGNORECASE)

# Words that make a name secret-looking: as the name's last word, or anywhere.
_LAST_WORDS = frozenset({
    "key", "keys", "token", "tokens", "secret", "secrets", "password", "passwd", "pwd", "pass", "passphrase",
    "credential", "credentials", "creds", "auth", "apikey", "secretkey", "accesskey", "privatekey",
    "authtoken", "accesstoken", "refreshtoken", "clientsecret",
})  # fmt: skip
_ANY_WORDS = frozenset({"password", "passwd", "secret", "apikey", "credentials", "passphrase"})
# A hint that a secret-looking name may be near: the assignment check runs only on such lines.
# Searched in the lower-cased text (faster than an IGNORECASE search) when lowering keeps offsets.
_HINT_WORDS = r"key|token|secret|passw|pwd|pass(?![a-z])|credential|creds|auth"
_HINT = re.compile(_HINT_WORDS)
_HINT_ANY_CASE = re.compile(_HINT_WORDS, re.IGNORECASE)
# NAME <assign> VALUE. The name may sit in quotes or brackets ("name":, ["NAME"] =, 'name' =>);
# the value in quotes (any quote) or bare (YAML, .env, shell).
_ASSIGN = re.compile(
    r"(?<![\w.$@-])(?P<name>[A-Za-z_$@][\w.$@-]{0,100})[\"'`]?\]?(?P<ann>\s{0,4}:\s{0,4}[A-Za-z_][\w.\[\], |]{0,40}?)?"
    r"\s{0,8}(?P<op>:=|=>|==|=|:)(?!=)\s{0,8}(?:[A-Za-z_][\w.]{0,40}\(\s{0,4})?@?"
    r"(?P<q>[\"'`]?)(?P<value>[^\s\"'`,;)}\]]{16,512})(?P=q)"
)
_NAME_WORDS = re.compile(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_BARE_VALUE = re.compile(r"[A-Za-z0-9+/=_~!@#$%^&*-]+\Z")  # an unquoted value (.env, YAML): one word
_BARE_END = re.compile(r"\s*(?:(?:#|//|;).*)?\Z")  # after an unquoted value: nothing, or a comment
_DOTTED_NAME = re.compile(r"[A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*){2,}\Z")
_HEX = re.compile(r"[0-9a-fA-F]+\Z")
_CODE_VALUE = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+\Z|[A-Za-z_]\w*\(|[A-Za-z]+(?:_[A-Za-z0-9]+)+\Z")
_LINE_BREAK = re.compile(r"\r\n|\n|\r")
_KEY_BODY = re.compile(r"[\s\"'`]{0,40}(?:[A-Za-z0-9+/]{16,200}={0,2}|(?:Proc-Type|DEK-Info|Comment|Version):.{0,200})"
                       r"[\s\"'`,;+\\n]{0,40}\Z")
_KEY_END = re.compile(r"-----END (?:[A-Z0-9]{1,20} ){0,4}PRIVATE KEY(?: BLOCK)?-----|---- END SSH2")


def shannon_entropy(text: str) -> float:
    """Bits per character of `text`'s character distribution."""
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _secret_name(name: str) -> bool:
    words = [w.lower() for w in _NAME_WORDS.findall(name.rsplit(".", 1)[-1])]
    words = [w for w in words if not w.isdigit()]
    if not words:
        return False
    joined = "".join(words)
    return (words[-1] in _LAST_WORDS or joined in _LAST_WORDS or any(w in _ANY_WORDS for w in words)
            or joined.endswith(("apikey", "secretkey", "accesskey", "privatekey", "authtoken", "accesstoken")))


def _random_value(value: str, quoted: bool) -> bool:
    if not MIN_VALUE_CHARS <= len(value) <= MAX_VALUE_CHARS or not any(c.isdigit() for c in value):
        return False
    if not quoted and (not _BARE_VALUE.match(value) or _CODE_VALUE.match(value)):
        return False  # a bare expression: a name, a call, a.b.c, an index
    if not quoted and value[:2] in ("0x", "0X"):
        return False  # a number
    if _DOTTED_NAME.match(value):
        return False  # a module path or a reverse-DNS name: com.example.key_type
    if "://" in value or value.startswith(("/", "./", "~/", "$", "%", "{", "<")):
        return False  # a URL (its credentials are checked apart), a path, a placeholder
    if _HEX.match(value):
        return shannon_entropy(value) >= ENTROPY_HEX
    return shannon_entropy(value) >= ENTROPY


def _hints(text: str) -> list[re.Match]:
    low = text.lower()
    if len(low) == len(text):
        return list(_HINT.finditer(low))
    return list(_HINT_ANY_CASE.finditer(text))  # a character whose lower case is longer


def find_secrets(line: str) -> list[Span]:
    """The secrets in one line (offsets in `line`), in order; [] for almost every line of code."""
    spans = _shape_spans(line)
    if "://" in line and "@" in line:
        for m in _URL_CREDENTIALS.finditer(line):
            if not _PLACEHOLDER.search(m.group("pw")):
                spans.append(Span(m.start("pw"), m.end("pw"), "url_credentials"))
    if _hints(line):
        for m in _ASSIGN.finditer(line):
            if m.group("op") == "==" or not _secret_name(m.group("name")):
                continue
            quoted = bool(m.group("q"))
            if not quoted and not _BARE_END.match(line, m.end()):
                continue
            if _random_value(m.group("value"), quoted):
                spans.append(Span(m.start("value"), m.end("value"), "assigned_secret"))
    spans.sort(key=lambda s: (s.start, s.end))
    return spans


def contains_secret(text: str) -> bool:
    """Does any line of `text` hold a secret?"""
    return bool(secret_lines(text))


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in _LINE_BREAK.finditer(text)]


def secret_lines(text: str) -> list[int]:
    """0-based numbers of the lines of `text` to mask (a private key block: all its lines), sorted.

    Whole-text searches first: a text with no token shape, no URL credentials and no
    secret-looking word costs three regex scans and nothing per line."""
    hits: set[int] = set()
    starts: list[int] | None = None
    key_begins: list[int] = []
    for m in _SHAPE_RE.finditer(text):
        starts = starts or _line_starts(text)
        n = bisect.bisect_right(starts, m.start()) - 1
        hits.add(n)
        if _SHAPE_KIND[m.lastgroup or ""] == "private_key" and m.group().startswith("-----BEGIN"):
            key_begins.append(n)
    candidates: set[int] = set()
    at = text.find("://")
    while at >= 0:  # a URL: its line is checked for credentials when it holds an '@'
        starts = starts or _line_starts(text)
        candidates.add(bisect.bisect_right(starts, at) - 1)
        at = text.find("://", at + 3)
    for m in _hints(text):
        starts = starts or _line_starts(text)
        candidates.add(bisect.bisect_right(starts, m.start()) - 1)
    if starts is None:
        return []
    ends = starts[1:] + [len(text)]
    for n in candidates - hits:
        if find_secrets(text[starts[n] : ends[n]]):
            hits.add(n)
    for n in key_begins:  # the block's body lines (base64) hold no shape of their own
        last = min(n + MAX_KEY_BLOCK_LINES, len(starts) - 1)
        end = _KEY_END.search(text, starts[n], ends[last])
        if end is not None:
            last = bisect.bisect_right(starts, end.start()) - 1
        else:  # no END line: the body is the run of key-like lines after BEGIN
            k = n + 1
            while k <= last and _KEY_BODY.match(text, starts[k], ends[k]):
                k += 1
            last = k - 1
        hits.update(range(n, last + 1))
    return sorted(hits)


def mask_secrets(text: str) -> tuple[str, int]:
    """`text` with every line holding a secret emptied (its line break kept), and how many
    lines were masked. Line numbers do not change; lines without a secret are untouched."""
    lines = secret_lines(text)
    if not lines:
        return text, 0
    starts = _line_starts(text)
    out: list[str] = []
    pos = 0
    for n in lines:
        s = starts[n]
        brk = _LINE_BREAK.search(text, s)
        e = brk.start() if brk is not None else len(text)
        out.append(text[pos:s])
        pos = e
    out.append(text[pos:])
    return "".join(out), len(lines)


MASK_PIECE_CHARS = 1 << 14  # characters masked per call of mask_in_pieces' `between` (~3 ms of regex scans)


def mask_in_pieces(text: str, between: Callable[[], None]) -> tuple[str, int]:
    """`mask_secrets(text)` a piece of about MASK_PIECE_CHARS at a time, calling `between()`
    between two pieces. The whole-text regular expressions each scan their text in one call,
    which holds the GIL: on a file of a megabyte, long enough to stall a suggestion computed
    meanwhile. Pieces end at line breaks, and never inside the MAX_KEY_BLOCK_LINES lines after
    a private key's BEGIN line (a block is masked whole), so the result is mask_secrets'."""
    n = len(text)
    if n <= MASK_PIECE_CHARS:
        return mask_secrets(text)
    out: list[str] = []
    count = 0
    pos = 0
    while pos < n:
        end = _line_end(text, pos + MASK_PIECE_CHARS)
        while end < n:  # a key block begun near the end: the piece takes the block's lines too
            j = text.rfind(_KEY_MARK, pos, end)
            if j < 0 or max(text.count("\n", j, end), text.count("\r", j, end)) > MAX_KEY_BLOCK_LINES:
                break
            end = _lines_forward(text, end, MAX_KEY_BLOCK_LINES + 1)
        if pos:
            between()
        masked, k = mask_secrets(text[pos:end])
        out.append(masked)
        count += k
        pos = end
    return "".join(out), count


_KEY_MARK = "-----BEGIN"


def _line_end(text: str, at: int) -> int:
    """The position after the first line break at or after `at` (len(text) if none)."""
    if at >= len(text):
        return len(text)
    m = _LINE_BREAK.search(text, at)
    return m.end() if m is not None else len(text)


def _lines_forward(text: str, at: int, lines: int) -> int:
    for _ in range(lines):
        if at >= len(text):
            break
        at = _line_end(text, at)
    return at


def mask_keeping_offset(text: str, offset: int) -> tuple[str, int, int]:
    """`mask_secrets(text)` and where `offset` (a position in `text`) lands in the masked text:
    the same column on an untouched line, the start of the line when its line was masked."""
    lines = secret_lines(text)
    if not lines:
        return text, offset, 0
    masked, count = mask_secrets(text)
    starts, new_starts = _line_starts(text), _line_starts(masked)
    n = bisect.bisect_right(starts, offset) - 1
    col = 0 if n in set(lines) else offset - starts[n]
    return masked, min(new_starts[n] + col, len(masked)), count


def inserted_secret(line_before: str, insertion: str, line_after: str = "") -> bool:
    """Would inserting `insertion` between `line_before` and `line_after` (the cursor's line
    around it) put a secret, or part of one, on that line? An insertion that only follows a
    secret the line already holds is not one."""
    if not insertion:
        return False
    first, sep, rest = insertion.partition("\n")
    lo, hi = len(line_before), len(line_before) + len(first)
    line = line_before + first + ("" if sep else line_after)
    if any(s.start < hi and s.end > lo for s in find_secrets(line)):
        return True
    return bool(sep) and contains_secret(rest + line_after)


def introduced_secrets(new_text: str, old_text: str) -> list[str]:
    """The secrets of `new_text` that `old_text` does not hold verbatim (what an answer would
    add to the text it replaces)."""
    out: list[str] = []
    lines = _LINE_BREAK.split(new_text)
    for n in secret_lines(new_text):
        line = lines[n]
        spans = find_secrets(line)
        if not spans:  # a private key block's body line
            if line.strip() and line not in old_text:
                out.append(line)
            continue
        out.extend(line[s.start : s.end] for s in spans if line[s.start : s.end] not in old_text)
    return out

"""What the server reports about itself: the dlm/status notification, the dlm/stats answer, and
why an explicit trigger showed nothing.

dlm/status carries the model's state (lsp.engine_holder), the workspace index's
(lsp.workspace_index), the line an editor shows, the latency percentiles and the counters of
what was offered and held back (lsp.stats), and the outcome of the last explicit trigger. The
server (lsp.server) decides when to send it; this module only says what it holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlm.coder_model.types import EngineStatus
from dlm.lsp.stats import Stats

INDEX_BUSY = ("loading", "indexing")  # index states in which the status is not "ready"
# Why an explicit trigger showed nothing, from what the request counted, most telling first.
TRIGGER_REASONS = {
    "binary": "a binary document (it holds NUL bytes): no suggestions",
    "held_back_syntax": "held back: accepting it would break the syntax",
    "held_back_degenerate": "held back: a degenerate answer (repeats, blank lines)",
    "gated_low_confidence": "nothing over the confidence gate (minConfidence)",
    "gated_rewrites_recent": "nothing over the gate for text that rewrites what you just typed",
    "gated_late": "the answer came after its deadline",
    "no_steps": "no time for a model step (deadlineMs)",
    "no_change": "nothing to propose here: the memory has no continuation and the model proposes no change",
    "failed": "the model failed on this request (see the server log)",
    "refused": "the model refused this request (see the server log)",
}


def status_text(state: str, message: str, index: dict) -> str:
    """The status line: "ready" only when the model answers and the index is done; while it is
    built, "indexing 38/77 files"; the model's state and why it is not ready otherwise, with the
    index's line after it ("model loading · indexing 38/77 files")."""
    if state == "ready":
        return index["text"] if index["state"] in INDEX_BUSY else f"ready · {index['text']}"
    why = f": {message}" if message else ""
    return f"model {state}{why} · {index['text']}"


def backend_text(backend: dict) -> str:
    """A hosted engine's part of the status line (coder_model.hosted): its kind and latency, or
    its problem in words."""
    if backend.get("problem"):
        return str(backend["problem"])
    p50 = backend.get("p50_ms")
    return f"{backend.get('kind')} {p50:.0f} ms" if p50 is not None else str(backend.get("kind"))


def status_payload(st: EngineStatus, stats: Stats, index: dict, trigger: dict | None,
                   notes: list[str] | tuple[str, ...] = ()) -> dict:
    """dlm/status: `state` is the model's; `index` the workspace index's (lsp.workspace_index);
    `ready` is true once both are done (the model answers, the index is built or loaded, or
    it failed or is off: `index` says which) and `text` is the line an editor shows. A hosted
    engine adds `backend` (its kind, host, model, latency p50 and problem: docs/engines.md) and
    its part of the line; `notes` say what was ignored of the engine's settings."""
    c = stats.counts
    text = status_text(st.state, st.message, index)
    backend = st.extra.get("backend") if isinstance(st.extra, dict) else None
    if isinstance(backend, dict) and st.state == "ready":
        text += f" · {backend_text(backend)}"
    if notes:  # each note's words before its first colon are its short form
        text += " · " + "; ".join(n.split(":", 1)[0] for n in notes)
    extra: dict = {}
    if isinstance(backend, dict):
        extra["backend"] = backend
    if notes:
        extra["notes"] = list(notes)
    return {
        "ready": st.state == "ready" and index["state"] not in INDEX_BUSY,
        "text": text,
        "state": st.state,
        "device": st.device,
        "model": st.model,
        "message": st.message,
        "p50_ms": stats.p(50),
        "p95_ms": stats.p(95),
        "requests": c["requests"],
        "accepted": c["accepted"],
        "shown": c["shown"],
        **stats.held_back(),
        "index": index,
        "trigger": trigger,
        **extra,
    }


def trigger_outcome(shown: bool, counts: Mapping[str, int], before: Mapping[str, int], document_open: bool,
                    last_confidence: float | None, min_confidence: float) -> dict:
    """dlm/status `trigger` after an explicit trigger: {shown, reason}. The reason is what the
    request counted (lsp.stats: `counts` now against `before` it), most telling first."""
    if shown:
        return {"shown": True, "reason": ""}
    counted = {k for k, v in counts.items() if v > before.get(k, 0)}
    if not document_open:
        reason = ("this document is not open in the server (never opened, or over "
                  "maxDocumentChars): reopen it, or raise maxDocumentChars")
    else:
        reason = next((TRIGGER_REASONS[k] for k in TRIGGER_REASONS if k in counted),
                      "no answer: the request was superseded, or the model is not ready (see dlm/status)")
        if any(k.startswith("gated_") for k in counted) and last_confidence is not None:
            reason += f" (confidence {last_confidence:.2f}, gate {min_confidence:.2f})"
    return {"shown": False, "reason": reason}


def stats_payload(stats: Stats, documents: int, pending_futures: int, state: str, workspace_folders: int,
                  index: dict, trigger: dict | None) -> dict:
    """dlm/stats: the counters and stage times (lsp.stats), the open documents, pygls' request table
    (bounded: lsp.pygls_protocol), the model's state, the workspace folders, the index's status and
    the last explicit trigger (also in dlm/status)."""
    out = stats.snapshot()
    out["documents"] = documents
    out["pending_futures"] = pending_futures
    out["state"] = state
    out["workspace_folders"] = workspace_folders
    out["index"] = index
    out["trigger"] = trigger
    return out

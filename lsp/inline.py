"""The inline-prediction pipeline: from a keystroke's document and cursor to an `InlineAnswer`.

`InlinePredictor.predict` runs one model job per document under latest wins (lsp.latest_wins).
When the job starts it builds the prompt (lsp.context), adds the repository memory's proposals
while typing (lsp.memory_proposals) and queues it on the engine (`Engine.submit`, through
lsp.engine_runs). The answer is post-processed (lsp.postprocess), held back when accepting it
would break the syntax (lsp.syntax_check) or when it is degenerate, its stages are counted
(lsp.stats), and it says which of its spans replace lines the user just typed (lsp.gate).

What is shown of it is decided here too (`shows_insertion`, `shows_edits`: the answer proposes
something of that kind and passes the confidence gate); lsp.inline_items makes the inline list,
lsp.edit_prediction the model's edits, lsp.server the completion list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeGuard

from dlm.coder_model import limits
from dlm.coder_model.languages import language_name
from dlm.coder_model.types import CancelToken, traits_of
from dlm.lsp import context, gate, memory_proposals, postprocess, syntax_check
from dlm.lsp.documents import Document
from dlm.lsp.engine_runs import Ran, engine_future
from dlm.lsp.hosted_filter import SendFilter
from dlm.lsp.server_context import ServerContext
from dlm.lsp.workspace_index import file_path

if TYPE_CHECKING:
    from dlm.lsp.latest_wins import LatestWins

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InlineAnswer:
    """A completed model run at a position, post-processed: the inline list, the completion list
    and the model's edit prediction are made from it."""

    version: int  # the document's version the run saw
    row: int
    col: int
    built: context.BuiltContext
    sugg: postprocess.Suggestion
    confidence: float | None  # the engine's, None when it computes none (the gate lets it through)
    late: bool
    # the memory's proposals the check let through, best first (lsp.inline_alternatives)
    proposal_confidences: tuple[tuple[str, float], ...]
    inline_rewrites_recent: bool  # the inline insertion replaces lines typed recently (lsp.gate)
    edits_rewrite_recent: bool  # the region's edits do
    # False: the confidence is no probability (a hosted engine's answer, Prediction.scored)
    scored: bool = True

    def at(self, version: int, row: int, col: int) -> bool:
        """The answer is for this version of the document and this cursor."""
        return (self.version, self.row, self.col) == (version, row, col)


@dataclass(frozen=True)
class InlineContext(ServerContext):
    """The server's context (lsp.server_context) and what only the inline pipeline uses: the
    latest-wins scheduler, and the server's hook after each completed run."""

    scheduler: LatestWins | None = None
    answered: Callable[[], None] = lambda: None  # after each completed run (the server may send dlm/status)


class InlinePredictor:
    """The pipeline and what it keeps across keystrokes: the last answer of each document (the
    model's edit prediction reuses it at the same position), the lines typed recently in each
    (the confidence gate), the confidence the gate judged last, the engine refusals logged."""

    def __init__(self, ctx: InlineContext) -> None:
        self.ctx = ctx
        self.last: dict[str, InlineAnswer] = {}  # uri -> the last answer
        self.recent: dict[str, gate.RecentEdits] = {}  # uri -> lines typed recently (confidence gate)
        self.last_confidence: float | None = None  # of the last answer the gate judged
        self._refused_messages: set[str] = set()  # engine refusals already logged (once each)
        self.send_filter = SendFilter(ctx.workspace_index)  # what a hosted engine may be sent

    def recent_edits(self, uri: str) -> gate.RecentEdits:
        """The lines typed recently in `uri`, for its changes to be recorded in."""
        return self.recent.setdefault(uri, gate.RecentEdits(self.ctx.options.recent_edit_s))

    def changed(self, uri: str) -> None:
        """The document changed: its last answer is for the text before the change."""
        self.last.pop(uri, None)

    def forget(self, uri: str) -> None:
        """The document is closed or re-opened: nothing kept for it counts."""
        self.last.pop(uri, None)
        self.recent.pop(uri, None)

    async def predict(self, doc: Document, row: int, col: int, mode: str) -> InlineAnswer | None:
        """Run the model (latest wins) and post-process; None when there is nothing to show."""
        ctx = self.ctx
        t0 = time.monotonic()
        ctx.stats.add("requests")
        if not ctx.holder.ready():
            ctx.stats.add("empty")
            return None
        version = doc.version
        # a hosted engine has a deadline of its own (engine.deadlineMs: a remote model takes longer)
        deadline_ms = traits_of(ctx.holder.engine).deadline_ms or ctx.options.deadline_ms
        deadline = gate.deadline_at(doc.last_change_at, t0, deadline_ms)
        start = self._starter(doc, row, col, mode, deadline)

        def valid() -> bool:
            return ctx.documents.get(doc.uri) is doc and doc.version == version

        ran = await ctx.scheduler.submit(
            doc.uri, (version, row, col), None, valid, ctx.options.scheduler.timeout_ms / 1000.0, start=start
        )
        if ran is None or ran.prediction.cancelled:
            ctx.stats.add("empty")
            return None
        if not valid():  # finished, but the document moved on: never show it
            ctx.stats.add("outdated")
            return None
        return self._answer(doc, row, col, version, ran, t0, deadline)

    def _starter(self, doc: Document, row: int, col: int, mode: str,
                 deadline: float) -> Callable[[CancelToken], Future | None]:
        """The job's start (lsp.latest_wins): it runs when the job starts, after latest wins, so a
        superseded or joining request builds no context. The engine, its windows, the sampler and
        the document's path are the request's, taken now."""
        ctx = self.ctx
        engine = ctx.holder.engine
        windows = ctx.windows(engine.budget)
        params, path, opts = ctx.sampler_params(), ctx.path_of(doc.uri), ctx.options.context

        def start(cancel: CancelToken) -> Future | None:
            t_start = time.monotonic()
            built = context.build(doc, row, col, mode, opts, windows, path)
            if built is None:
                return None
            # path, language and history entries are cut to coder_model.limits before any tokenizer
            built = replace(built, prompt=limits.bound_fields(built.prompt))
            memory, rel = memory_proposals.memory_for(doc, built, ctx.options, ctx.workspace_index)
            ctx_ms = (time.monotonic() - t_start) * 1000

            def run(b: context.BuiltContext) -> Future:
                return engine_future(engine, b, ctx_ms, params, cancel, deadline, self.refused)

            if traits_of(engine).hosted:  # text leaves the machine: the index's filters first
                direct = run

                def run(b: context.BuiltContext) -> Future:
                    return self.send_filter.guarded(file_path(doc.uri), lambda: direct(b), ctx.pool)

            if memory is None:
                return run(built)
            return memory_proposals.checked_by_model(memory, rel, doc, row, col, built, run, cancel, ctx.pool,
                                                     ctx.stats, ctx.workspace_index, ctx.options)

        return start

    def _answer(self, doc: Document, row: int, col: int, version: int, ran: Ran, t0: float,
                deadline: float) -> InlineAnswer:
        """The run's answer, post-processed and counted; kept as the document's last answer."""
        built, pred = ran.built, ran.prediction
        prompt = built.prompt
        t_model = time.monotonic()
        sugg = postprocess.suggest(prompt.region, prompt.cursor, pred.text, prompt.suffix, prompt.prefix)
        broken = self.breaks_syntax(doc, row, col, sugg)
        t_post = time.monotonic()
        late = pred.late or t_post > deadline  # the engine's word, or the time it took to get here
        self._count_run(ran, late, t0, t_model, t_post)
        log.debug(
            "run %s v%d %s: %.1f ms (ctx %.1f, prefill %.1f, denoise %.1f) steps %d tokens %d "
            "context %d cached %d region %d chars",
            doc.uri.rsplit("/", 1)[-1], version, built.mode, (t_post - t0) * 1000, ran.context_ms,
            pred.prefill_ms, pred.denoise_ms, pred.steps, pred.tokens, pred.context_tokens,
            pred.cached_tokens, len(prompt.region),
        )  # fmt: skip
        if broken:  # accepting it would break the code (lsp.syntax_check): never shown
            self.ctx.stats.add("held_back_syntax")
            log.info("held back an insertion that %s: %.80r", broken, sugg.insert_text)
            sugg.insert_text, sugg.replace_end = "", None
        self.ctx.answered()
        self._count_outcome(sugg)
        recent = self.recent.get(doc.uri)

        def rewrites_recent(spans: list[tuple[int, int]]) -> bool:
            lines = gate.replaced_lines(prompt.region, built.start_line, spans)
            return recent is not None and recent.touches(lines, t_post)

        inline_spans = [(prompt.cursor, sugg.replace_end)] if sugg.replace_end is not None else []
        answer = InlineAnswer(
            version=version, row=row, col=col, built=built, sugg=sugg, confidence=pred.confidence, late=late,
            proposal_confidences=pred.proposal_confidences,
            inline_rewrites_recent=rewrites_recent(inline_spans),
            edits_rewrite_recent=rewrites_recent([(e.start, e.end) for e in sugg.edits]),
            scored=pred.scored,
        )  # fmt: skip
        self.last[doc.uri] = answer
        return answer

    def _count_run(self, ran: Ran, late: bool, t0: float, t_model: float, t_post: float) -> None:
        """A completed run's counters and stage times (lsp.stats)."""
        stats, pred = self.ctx.stats, ran.prediction
        if late:
            stats.add("late")
        stats.add("completed")
        stats.add("steps", pred.steps)
        stats.add("tokens", pred.tokens)
        if pred.steps == 0 and pred.proposal_confidences:
            stats.add("memory_answers")  # the memory's proposal, answered without a model pass
        elif pred.steps == 0:
            # No model work (no time left for a step): a latency for it would be a lie.
            stats.add("no_steps")
            return
        stats.latency((t_post - t0) * 1000)
        stats.stage("context_ms", ran.context_ms)
        stats.stage("queue_ms", pred.queue_ms)
        stats.stage("prefill_ms", pred.prefill_ms)
        stats.stage("denoise_ms", pred.denoise_ms)
        # the model's part of the answer (the latency Target's quantity): queue, prefill, denoising
        stats.stage("model_ms", pred.queue_ms + pred.prefill_ms + pred.denoise_ms)
        stats.stage("wait_ms", (t_model - t0) * 1000 - ran.context_ms - pred.total_ms)
        stats.stage("postprocess_ms", (t_post - t_model) * 1000)
        # the server's own time on the request: all but the model's queue, prefill and denoising
        stats.stage("overhead_ms", (t_post - t0) * 1000 - pred.total_ms)

    def _count_outcome(self, sugg: postprocess.Suggestion) -> None:
        """Count an answer that shows nothing: empty, or held back as degenerate."""
        stats = self.ctx.stats
        if sugg.empty:
            stats.add("empty")
        if sugg.held_back:  # degenerate filler (coder_model.degenerate): never shown
            stats.add("held_back_degenerate")
            log.info("held back a degenerate answer (%s)", sugg.held_back)

    def breaks_syntax(self, doc: Document, row: int, col: int, sugg: postprocess.Suggestion) -> str | None:
        """Why accepting the inline insertion would break the document's syntax, or None
        (lsp.syntax_check; on the event loop, the document as the request saw it: a window of
        it is parsed, well under the model's time). A failure of the check shows the insertion."""
        if not sugg.insert_text:
            return None
        t0 = time.monotonic()
        try:
            return syntax_problem(doc, row, col, sugg)
        finally:
            self.ctx.stats.stage("syntax_ms", (time.monotonic() - t0) * 1000)

    def refused(self, exc: ValueError) -> None:
        """An engine refused a request: one warning per distinct reason (no traceback: it is a
        setting, not a crash), then the keystrokes go on with no suggestion."""
        self.ctx.stats.add("refused")
        message = str(exc)
        if message not in self._refused_messages and len(self._refused_messages) < 64:
            self._refused_messages.add(message)
            log.warning("the model refused a request: %s; check the sampler options "
                        "(initializationOptions.sampler)", message)

    def shows_insertion(self, answer: InlineAnswer | None) -> TypeGuard[InlineAnswer]:
        """Show the answer's inline insertion? It proposes one and passes the gate."""
        return self._proposes(answer, edits=False) and self.gate(answer, answer.inline_rewrites_recent)

    def shows_edits(self, answer: InlineAnswer | None) -> TypeGuard[InlineAnswer]:
        """Show the answer's edits of the region? It proposes some and passes the gate."""
        return self._proposes(answer, edits=True) and self.gate(answer, answer.edits_rewrite_recent)

    def _proposes(self, answer: InlineAnswer | None, edits: bool) -> TypeGuard[InlineAnswer]:
        """Did a completed run propose something of this kind (edits, else an insertion)? A run that
        proposed nothing is counted as `no_change`, so every completed run has an outcome."""
        if answer is None:
            return False
        if not (answer.sugg.edits if edits else answer.sugg.insert_text):
            self.ctx.stats.add("no_change")
            return False
        return True

    def gate(self, answer: InlineAnswer, rewrites_recent: bool) -> bool:
        """Show this answer? (lsp.gate); counts what it holds back by reason."""
        opts = self.ctx.options
        self.last_confidence = answer.confidence
        # an answer whose confidence is no probability (a hosted engine's) is gated as one with
        # none: through, except over what the user just typed (docs/architecture.md §12)
        confidence = answer.confidence if answer.scored or not rewrites_recent else None
        verdict = gate.decide(confidence, rewrites_recent, answer.late, opts.min_confidence,
                              opts.min_confidence_rewrite_recent)
        self.ctx.stats.add("offered" if verdict.show else f"gated_{verdict.reason}")
        return verdict.show


def syntax_problem(doc: Document, row: int, col: int, sugg: postprocess.Suggestion) -> str | None:
    """Why accepting `sugg`'s inline text would break the document's syntax (lsp.syntax_check),
    or None; a failure of the check (a grammar edge case) lets the text through."""
    try:
        language = language_name(doc.language_id, doc.uri)
        root = doc.syntax.tree().root_node if doc.syntax is not None else None  # the context parsed it
        replaces = sugg.replace_end is not None
        return syntax_check.check(language, doc.lines, row, col, sugg.insert_text, replaces, root)
    except Exception:  # a grammar edge case must not cost the suggestion
        log.exception("syntax check failed at row %d, column %d", row, col)
        return None

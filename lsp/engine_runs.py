"""A model run as a Future: the engine's answer to one built prompt, with the context it came from.

The inline pipeline (lsp.inline) and the repository memory's check (lsp.memory_proposals) queue a
prompt on the engine (`Engine.submit`: every engine answers with a Future, so no thread of the
server sits waiting on the model) and read the outcome as a `Ran`. A ValueError from the engine
is a request the model cannot take (e.g. blocks past its length): it is reported once through
`refused` and the run has no result; any other failure is the run's exception.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from dlm.coder_model.types import CancelToken, Engine, Prediction, SamplerParams
from dlm.lsp.context import BuiltContext


@dataclass(frozen=True)
class Ran:
    """A model run's context and its prediction (one per job, shared by the requests that joined it)."""

    built: BuiltContext
    prediction: Prediction
    context_ms: float


def engine_future(engine: Engine, built: BuiltContext, context_ms: float, params: SamplerParams,
                  cancel: CancelToken, deadline: float, refused: Callable[[ValueError], None]) -> Future:
    """A Future of the Ran for `built`, queued on the engine (`Engine.submit`); its result is None
    when the engine refused the request (`refused` is told why)."""
    inner = engine.submit(built.prompt, params, cancel, deadline)
    out: Future = Future()

    def done(f: Future) -> None:
        exc = f.exception()
        if isinstance(exc, ValueError):  # the model cannot take this request (e.g. blocks past its length)
            refused(exc)
            out.set_result(None)
        elif exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(Ran(built, f.result(), context_ms))

    inner.add_done_callback(done)
    return out


def chain(inner: Future, out: Future) -> None:
    """Resolve `out` with `inner`'s outcome."""

    def done(f: Future) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result())

    inner.add_done_callback(done)

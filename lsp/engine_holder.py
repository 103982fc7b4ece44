"""The engine behind the language server and the HTTP endpoint, loaded in the background.

Both front ends answer at once (LSP `initialize`, HTTP `/health`) while the
model loads; `EngineHolder` runs the factory in a thread and remembers how
that went. `make_engine_factory` turns the command line into that factory:
a local checkpoint, a `dlm-lsp serve` box (--remote), a model behind an HTTP
API (--engine KIND: coder_model.hosted, docs/engines.md), or a test double
(DLM_ENGINE_FACTORY). The language server may replace the factory before it
starts loading (`set_factory`): a user-scoped engine in initializationOptions.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from dlm.coder_model.types import Engine, EngineStatus

log = logging.getLogger(__name__)


class EngineRefused(Exception):
    """An engine that cannot be made, for a reason in the user's settings: its message is the
    status line's as it is (no advice about --model)."""


class EngineHolder:
    """Loads the engine once, in a background thread, and says whether it is ready.

    `on_change` is called (from the loader thread, or from `ready()`) whenever the
    engine's state changes, so the LSP can send `dlm/status`.
    """

    def __init__(self, factory: Callable[[], Engine], on_change: Callable[[], None] | None = None) -> None:
        self.engine: Engine | None = None
        self.status = EngineStatus(state="loading")
        self._factory = factory
        self._on_change = on_change or (lambda: None)
        self._lock = threading.Lock()
        self._started = False
        self._loaded = threading.Event()

    def set_factory(self, factory: Callable[[], Engine]) -> bool:
        """Load with `factory` instead; False (nothing changed) once loading has started."""
        with self._lock:
            if self._started:
                return False
            self._factory = factory
            return True

    def start(self) -> None:
        """Start loading (once; later calls do nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._load, name="dlm-engine-load", daemon=True).start()

    def _load(self) -> None:
        t0 = time.monotonic()
        try:
            engine = self._factory()
            st = engine.status()
            self.engine = engine
            self.status = replace(st, state=st.state if st.state != "loading" else "ready")
            if hasattr(engine, "on_status_change"):
                # A remote engine connects and disconnects on its own: follow it at once
                # rather than at the next request (dlm/status in the editor).
                engine.on_status_change = self.refresh
                self.refresh()  # it may have connected or failed before we listened
            log.info("engine ready in %.1f s: %s", time.monotonic() - t0, self.status)
        except EngineRefused as exc:
            log.warning("no engine: %s", exc)
            self.status = EngineStatus(state="failed", message=str(exc))
        except BaseException as exc:  # a failed load must leave the front end running, with the reason
            log.exception("model failed to load")
            self.status = EngineStatus(
                state="failed",
                message=f"the model failed to load: {type(exc).__name__}: {exc}. "
                "Check --model (a checkpoint directory with config.json) or --remote, "
                "then restart the server; suggestions are off until then.",
            )
        finally:
            self._loaded.set()
        try:
            self._on_change()
        except Exception:  # the front end is ending (its event loop closed): nobody is left to tell
            log.debug("the engine's new state was not announced", exc_info=True)

    def loading(self) -> bool:
        """True while the loader thread runs (started and not finished)."""
        return self._started and not self._loaded.is_set()

    @property
    def error(self) -> str:
        """Why the model failed to load ('' while loading or when loaded)."""
        return self.status.message if self.status.state == "failed" else ""

    def ready(self) -> bool:
        """True when the engine can take a request now (a remote one may be disconnected)."""
        return self.refresh()

    def refresh(self) -> bool:
        """Read the engine's status (calling `on_change` when its state moved); True when ready."""
        if self.engine is None:
            return False
        try:
            st = self.engine.status()
        except Exception:  # noqa: BLE001 - a status that fails means "not ready", not a crash
            return False
        # a hosted engine's problem ("Inception API: 429, ...") changes its words, not its state
        changed = st.state != self.status.state or st.message != self.status.message
        self.status = st  # the latest figures (a hosted engine's latency) even when nothing changed
        if changed:
            self._on_change()
        return st.state == "ready"

    def wait_loaded(self, timeout_s: float) -> Engine | None:
        """Start loading if needed and wait up to `timeout_s` for it; the engine, or None
        (still loading, or failed: see `status`)."""
        self.start()
        self._loaded.wait(timeout_s)
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def hosted_factory(settings) -> Callable[[], Engine]:
    """A factory of the hosted engine of `settings` (coder_model.hosted.settings.EngineSettings);
    httpx is imported in the loader thread, when it runs."""

    def hosted() -> Engine:
        from dlm.coder_model.hosted.settings import EngineSettingsError

        try:
            from dlm.coder_model.hosted.http_engine import HostedEngine

            return HostedEngine(settings)
        except ImportError as exc:
            raise EngineRefused(f"the hosted engines need httpx ({exc}): pip install 'httpx>=0.27'") from None
        except EngineSettingsError as exc:
            raise EngineRefused(f"{exc}; no suggestions until the engine settings are fixed") from None

    return hosted


def names_engine(args) -> bool:
    """Does the command line (or DLM_ENGINE_FACTORY) choose the engine? Then initializationOptions
    do not: the command line is the user's own."""
    return bool(os.environ.get("DLM_ENGINE_FACTORY") or getattr(args, "engine_factory", None)
                or getattr(args, "remote", None) or getattr(args, "model", None) or getattr(args, "engine_kind", None))


def make_engine_factory(args) -> Callable[[], Engine]:
    """The engine per the command line: DLM_ENGINE_FACTORY (tests), --remote, --engine, or local."""
    spec = os.environ.get("DLM_ENGINE_FACTORY") or getattr(args, "engine_factory", None)
    model = getattr(args, "model", None)
    device = getattr(args, "device", "auto") or "auto"
    if spec:
        module_name, _, fn = spec.partition(":")

        def from_spec() -> Engine:
            return getattr(importlib.import_module(module_name), fn)(model, device)

        return from_spec
    if getattr(args, "remote", None):

        def remote() -> Engine:
            from dlm.coder_model.remote.auth import load_token
            from dlm.coder_model.remote.client import RemoteEngine, parse_host_port

            host, port = parse_host_port(args.remote)  # also [v6]:port
            token = load_token(getattr(args, "token_file", None))  # the file, else $DLM_TOKEN
            return RemoteEngine(host, port, token=token, tls=bool(getattr(args, "tls", False)))

        return remote
    if getattr(args, "engine_kind", None):
        from dlm.coder_model.hosted.settings import settings_from_args

        return hosted_factory(settings_from_args(args))  # checked by the command's run()

    def local() -> Engine:
        # torch is imported here, in the loader thread: `import dlm.lsp` must stay light
        # so that the server answers `initialize` before the model is loaded.
        from dlm.coder_model.engine import load_engine

        return load_engine(model, device)

    return local

// VS Code client of `dlm-lsp --stdio`. Inline completions come from
// vscode-languageclient's inline-completion feature (LSP 3.18); this file adds
// what the library does not do: edit predictions away from the cursor
// (dlm/editPrediction), acceptance notifications, the status bar, commands.
// Edit predictions are shown as inline edits (InlineCompletionItem.isInlineEdit,
// proposed API `inlineCompletionsAdditions`) where the running VS Code allows it,
// and as decorations otherwise.
// Everything that can be computed without an editor lives in logic.ts.
import * as fs from "node:fs";
import * as vscode from "vscode";
import {
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
  ExecuteCommandRequest,
} from "vscode-languageclient/node";
import {
  type DlmSettings, type DlmStatus, type StatsSummary, type EditPredictionDisplay,
  type EditPredictionView, type InlineEditData,
  DEFAULT_SETTINGS, INLINE_EDIT_PROPOSAL, SettingsError, userOnlyValue, acceptedItemIndex,
  acceptedLength, buildServerCommand, findExecutable, serverNotFoundMessage, initializationOptions,
  chooseEditPredictionDisplay, inlineEditFor, inlineResultSource, itemIdOf, needsRestart,
  renderEditPrediction, statusBarData, statsMessage, summarizeStats, trimTrailingBlankLines,
  validateEditPrediction, jumpText, fileJumpText,
} from "./logic.js";

const ACCEPT_COMMAND = "dlm.acceptCompletion";
const STATS_REQUEST = "dlm/stats";
/** How long after a suggestion, an accept or a dlm/status the counters are asked for again. */
const STATS_REFRESH_MS = 300;

// The server is not on PyPI (the name dlm-lsp there is another project): it is installed
// from a clone of this repository into a virtualenv, whose bin/ is usually not on PATH.
const INSTALL_HINT =
  "Install the server from a clone of the dlm-lsp repository: `python -m venv .venv && " +
  ".venv/bin/pip install torch==2.13.0 -e .` (in the clone), then set dlm.server.path to the full path " +
  "of the virtualenv's bin/dlm-lsp (e.g. /path/to/dlm-lsp/.venv/bin/dlm-lsp) and run `dlm: Restart Server`.";

function readSettings(): DlmSettings {
  // USER_ONLY_SETTINGS come from the user's settings alone (a workspace's value is ignored, as the
  // "machine" scope in package.json also tells VS Code)
  const c = vscode.workspace.getConfiguration("dlm");
  const d = DEFAULT_SETTINGS;
  return {
    enable: c.get<boolean>("enable", d.enable),
    serverPath: userOnlyValue(c.inspect<string>("server.path"), d.serverPath),
    serverArgs: userOnlyValue(c.inspect<string[]>("server.args"), d.serverArgs),
    model: userOnlyValue(c.inspect<string>("model"), d.model),
    device: c.get<DlmSettings["device"]>("device", d.device),
    remoteAddress: userOnlyValue(c.inspect<string>("remote.address"), d.remoteAddress),
    remoteTokenFile: userOnlyValue(c.inspect<string>("remote.tokenFile"), d.remoteTokenFile),
    remoteTls: userOnlyValue(c.inspect<boolean>("remote.tls"), d.remoteTls),
    editPredictions: c.get<boolean>("editPredictions", d.editPredictions),
    editPredictionDelayMs: c.get<number>("editPredictionDelayMs", d.editPredictionDelayMs),
    editPredictionDisplay: c.get<DlmSettings["editPredictionDisplay"]>("editPredictionDisplay", d.editPredictionDisplay),
    minConfidence: c.get<number | null>("minConfidence", d.minConfidence),
    deadlineMs: c.get<number | null>("deadlineMs", d.deadlineMs),
    // the user's value only (its globalValue): a workspace's .vscode/settings.json never chooses the engine
    engine: userOnlyValue(c.inspect<Record<string, unknown> | null>("engine"), d.engine),
  };
}

/** The fields the inlineCompletionsAdditions proposal adds to InlineCompletionItem (not in @types/vscode). */
type ProposedInlineItem = vscode.InlineCompletionItem & {
  isInlineEdit?: boolean;
  showInlineEditMenu?: boolean;
  displayLocation?: { range: vscode.Range; label: string; kind?: number };
};

/** Runtime feature detection for inline edits: what the running VS Code offers this extension. */
function editPredictionDisplay(ctx: vscode.ExtensionContext, settings: DlmSettings): EditPredictionDisplay {
  const pkg = ctx.extension.packageJSON as { enabledApiProposals?: string[] };
  return chooseEditPredictionDisplay(settings.editPredictionDisplay, {
    version: vscode.version,
    enabledApiProposals: pkg.enabledApiProposals,
    hasDisplayLocationKind: displayLocationKinds() !== undefined,
    proposalProbe: pkg.enabledApiProposals?.includes(INLINE_EDIT_PROPOSAL) ? probeProposal() : undefined,
  });
}

/**
 * Whether VS Code lets this extension use the proposal: registering an inline completion
 * provider with metadata is refused (throws) without it. The provider matches no document
 * and is disposed at once.
 */
function probeProposal(): boolean {
  try {
    const register = vscode.languages.registerInlineCompletionItemProvider as unknown as (
      selector: vscode.DocumentSelector,
      provider: vscode.InlineCompletionItemProvider,
      metadata: { displayName: string },
    ) => vscode.Disposable;
    register({ scheme: "dlm-proposal-probe" }, { provideInlineCompletionItems: () => [] }, { displayName: "dlm" }).dispose();
    return true;
  } catch {
    return false;
  }
}

/** vscode.InlineCompletionDisplayLocationKind where it exists ({Code: 1, Label: 2}). */
function displayLocationKinds(): { Code: number; Label: number } | undefined {
  const k = (vscode as unknown as Record<string, unknown>).InlineCompletionDisplayLocationKind as
    | { Code?: number; Label?: number }
    | undefined;
  return k && typeof k.Code === "number" && typeof k.Label === "number" ? { Code: k.Code, Label: k.Label } : undefined;
}

function isExecutableFile(p: string): boolean {
  try {
    fs.accessSync(p, fs.constants.X_OK);
    return fs.statSync(p).isFile();
  } catch {
    return false;
  }
}

/** The items with their trailing blank lines removed (logic.trimTrailingBlankLines); items left empty are dropped. */
function withoutTrailingBlankLines(
  result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined,
  document: vscode.TextDocument,
  position: vscode.Position,
): vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined {
  if (!result) return result;
  const items = Array.isArray(result) ? result : result.items;
  const kept: vscode.InlineCompletionItem[] = [];
  for (const item of items) {
    if (typeof item.insertText === "string") {
      const end = item.range?.end ?? position;
      const rest = document.lineAt(end.line).text.slice(end.character);
      item.insertText = trimTrailingBlankLines(item.insertText, rest);
      if (!item.insertText) continue;
    }
    kept.push(item);
  }
  if (Array.isArray(result)) return kept;
  result.items = kept;
  return result;
}

/** The inline completion item VS Code is showing (as far as we know), for partial-accept notifications. */
interface ShownItem {
  uri: string;
  startOffset: number;
  text: string;
  lspItem: Record<string, unknown>;
}

interface ShownPrediction {
  uri: string;
  view: EditPredictionView;
  edits: { range: vscode.Range; newText: string }[];
  /** Set when the prediction is offered to VS Code as an inline edit instead of decorations. */
  inlineEdit?: InlineEditData;
}

class DlmExtension implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private settings: DlmSettings = readSettings();
  private status: DlmStatus | null = null;
  /** The server's counters (dlm/stats) as last fetched: shown / held back / accepted. */
  private counts: StatsSummary | null = null;
  private statsTimer: NodeJS.Timeout | undefined;
  private shownItems: ShownItem[] = []; // the inline list last handed to VS Code, best first
  private prediction: ShownPrediction | undefined;
  private predictionTimer: NodeJS.Timeout | undefined;
  private predictionCancel: vscode.CancellationTokenSource | undefined;
  private ownAcceptCommand: vscode.Disposable | undefined;
  private display: EditPredictionDisplay = { mode: "decorations", why: "not decided yet" };
  private ctx: vscode.ExtensionContext | undefined;
  /** Set while our own editor.action.inlineSuggest.trigger runs: answer with the inline edit only. */
  private triggeringInlineEdit = false;
  private readonly disposables: vscode.Disposable[] = [];
  private readonly statusItem: vscode.StatusBarItem;
  private readonly replaceDeco: vscode.TextEditorDecorationType;
  private readonly newTextDeco: vscode.TextEditorDecorationType;

  constructor(private readonly log: vscode.LogOutputChannel) {
    this.statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    this.statusItem.command = "dlm.toggle";
    this.statusItem.show();
    this.replaceDeco = vscode.window.createTextEditorDecorationType({
      backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
      textDecoration: "line-through",
    });
    this.newTextDeco = vscode.window.createTextEditorDecorationType({
      after: { color: new vscode.ThemeColor("editorGhostText.foreground"), fontStyle: "italic", margin: "0 0 0 1em" },
    });
    this.disposables.push(this.statusItem, this.replaceDeco, this.newTextDeco);
    this.renderStatus();
  }

  register(ctx: vscode.ExtensionContext): void {
    this.ctx = ctx;
    this.decideDisplay();
    const cmd = (name: string, fn: (...a: unknown[]) => unknown) =>
      this.disposables.push(vscode.commands.registerCommand(name, fn));
    cmd("dlm.toggle", () => this.toggle());
    cmd("dlm.restart", () => this.restart());
    cmd("dlm.showLog", () => this.log.show());
    cmd("dlm.showStats", () => this.showStats());
    cmd("dlm.accept", () => vscode.commands.executeCommand("editor.action.inlineSuggest.commit"));
    cmd("dlm.acceptWord", () => this.partialAccept("editor.action.inlineSuggest.acceptNextWord"));
    cmd("dlm.acceptLine", () => this.partialAccept("editor.action.inlineSuggest.acceptNextLine"));
    cmd("dlm.applyEditPrediction", () => this.applyPrediction());
    cmd("dlm.dismissEditPrediction", () => {
      const inline = !!this.prediction?.inlineEdit;
      this.clearPrediction();
      if (inline) void vscode.commands.executeCommand("editor.action.inlineSuggest.hide");
    });
    this.disposables.push(
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (e.affectsConfiguration("dlm")) this.onSettingsChanged();
      }),
      vscode.workspace.onDidChangeTextDocument((e) => {
        if (this.prediction && e.document.uri.toString() === this.prediction.uri) this.clearPrediction();
        this.schedulePrediction();
      }),
      vscode.window.onDidChangeTextEditorSelection(() => this.schedulePrediction()),
      vscode.window.onDidChangeActiveTextEditor(() => {
        this.clearPrediction();
        // Another editor (e.g. the file a "jump to another file" hint opened): ask about it.
        this.schedulePrediction();
      }),
    );
    ctx.subscriptions.push(this);
  }

  // -- server lifecycle ---------------------------------------------------

  /** The server could not start: one error message with its hint, the status bar in red. */
  private failed(msg: string): void {
    this.log.error(msg);
    this.status = { state: "failed", message: msg };
    this.renderStatus();
    const settings = "Open Settings";
    const log = "Show Log";
    void vscode.window.showErrorMessage(`dlm: ${msg}`, settings, log).then((pick) => {
      if (pick === settings) void vscode.commands.executeCommand("workbench.action.openSettings", "dlm.server");
      if (pick === log) this.log.show();
    });
  }

  async start(): Promise<void> {
    let cmd;
    try {
      cmd = buildServerCommand(this.settings);
    } catch (e) {
      this.failed(e instanceof SettingsError ? e.message : String(e));
      return;
    }
    // Checked here rather than left to the client library, which would show its own second,
    // hint-less error ("couldn't create connection to server") next to ours.
    const found = findExecutable(cmd.command, process.env.PATH ?? "", isExecutableFile, process.platform, process.env.PATHEXT);
    if (!found) {
      this.failed(`${serverNotFoundMessage(cmd.command)}. ${INSTALL_HINT}`);
      return;
    }
    this.log.info(`starting: ${cmd.command} ${cmd.args.join(" ")}`);
    const serverOptions: ServerOptions = { command: cmd.command, args: cmd.args }; // transport unset: args used as given
    const clientOptions: LanguageClientOptions = {
      documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
      outputChannel: this.log,
      initializationOptions: initializationOptions(this.settings),
      middleware: {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          if (!this.settings.enable) return null;
          const edit = this.pendingInlineEdit(document);
          const ours = this.triggeringInlineEdit;
          this.triggeringInlineEdit = false;
          let result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined;
          let count: number | null = null;
          if (!(edit && ours)) {
            result = withoutTrailingBlankLines(await next(document, position, context, token), document, position);
            count = (Array.isArray(result) ? result : (result?.items ?? [])).length;
          }
          const source = inlineResultSource({ editPending: !!edit, ourTrigger: ours, completionCount: count });
          if (source === "inlineEdit" && edit) return [this.inlineEditItem(edit, document)];
          this.noteShown(document, position, result);
          this.refreshStatsSoon();
          return result;
        },
        // Accepting an item runs dlm.acceptCompletion on the server (the library's command
        // when the server lists it): the accepted count changes, so the tooltip is refreshed.
        executeCommand: async (command, args, next) => {
          const r = await next(command, args);
          this.refreshStatsSoon();
          return r;
        },
      },
    };
    const client = new LanguageClient("dlm", "dlm", serverOptions, clientOptions);
    client.registerProposedFeatures();
    client.onNotification("dlm/status", (st: DlmStatus) => {
      this.status = st;
      this.renderStatus();
      if (st.state === "ready") this.refreshStatsSoon();
    });
    client.onDidChangeState((e) => {
      if (e.newState === State.Stopped) {
        // the index's last count went with the server: it is not shown as if it were current
        this.status = { ...(this.status ?? {}), state: "disconnected", ready: false, text: undefined, index: undefined,
          message: "the server stopped; run `dlm: Restart Server`" };
        this.renderStatus();
      }
    });
    this.client = client;
    try {
      await client.start();
    } catch (e) {
      this.failed(`could not start "${cmd.command}": ${e instanceof Error ? e.message : String(e)}. ${INSTALL_HINT}`);
      return;
    }
    // Accepting an inline item runs its command (dlm.acceptCompletion) in VS Code. The library
    // registers it when the server lists it under executeCommandProvider; otherwise forward it here.
    const listed = client.initializeResult?.capabilities.executeCommandProvider?.commands ?? [];
    if (!listed.includes(ACCEPT_COMMAND)) {
      this.ownAcceptCommand = vscode.commands.registerCommand(ACCEPT_COMMAND, (...args: unknown[]) =>
        this.sendAccept(args),
      );
    }
  }

  private async stop(): Promise<void> {
    this.clearPrediction();
    this.ownAcceptCommand?.dispose();
    this.ownAcceptCommand = undefined;
    const c = this.client;
    this.client = undefined;
    if (c) {
      try {
        await c.stop(2000);
      } catch (e) {
        this.log.warn(`stopping the server: ${String(e)}`);
      }
    }
  }

  async restart(): Promise<void> {
    this.log.info("restarting the server");
    await this.stop();
    this.status = null;
    this.counts = null;
    this.renderStatus();
    await this.start();
  }

  private decideDisplay(): void {
    if (!this.ctx) return;
    const d = editPredictionDisplay(this.ctx, this.settings);
    if (d.mode !== this.display.mode || d.why !== this.display.why) this.log.info(`edit predictions: ${d.why}`);
    this.display = d;
  }

  private onSettingsChanged(): void {
    const old = this.settings;
    this.settings = readSettings();
    if (old.editPredictionDisplay !== this.settings.editPredictionDisplay) {
      this.clearPrediction();
      this.decideDisplay();
    }
    if (needsRestart(old, this.settings)) void this.restart();
    if (!this.settings.enable || !this.settings.editPredictions) this.clearPrediction();
    this.renderStatus();
  }

  private async toggle(): Promise<void> {
    await vscode.workspace.getConfiguration("dlm").update("enable", !this.settings.enable, vscode.ConfigurationTarget.Global);
  }

  private renderStatus(): void {
    const d = statusBarData(this.status, this.settings.enable, this.counts);
    this.statusItem.text = d.text;
    this.statusItem.tooltip = d.tooltip;
    this.statusItem.backgroundColor = d.error ? new vscode.ThemeColor("statusBarItem.errorBackground") : undefined;
  }

  private running(): LanguageClient | undefined {
    return this.client && this.client.state === State.Running ? this.client : undefined;
  }

  // -- counters: dlm/stats ---------------------------------------------------

  /** The server's counters now; null (and a log line) when it cannot answer. */
  private async fetchStats(): Promise<StatsSummary | null> {
    const c = this.running();
    if (!c) return null;
    try {
      const raw = await c.sendRequest(STATS_REQUEST, {});
      const s = summarizeStats(raw);
      if (!s) this.log.warn(`${STATS_REQUEST} answered ${JSON.stringify(raw)}; expected an object of counters`);
      else this.log.debug(`${STATS_REQUEST}: ${JSON.stringify(raw)}`);
      return s;
    } catch (e) {
      this.log.warn(`${STATS_REQUEST}: ${String(e)}`);
      return null;
    }
  }

  /** Refresh the tooltip's counters shortly (one request for a burst of events). */
  private refreshStatsSoon(): void {
    if (this.statsTimer) return;
    this.statsTimer = setTimeout(async () => {
      this.statsTimer = undefined;
      const s = await this.fetchStats();
      if (s) {
        this.counts = s;
        this.renderStatus();
      }
    }, STATS_REFRESH_MS);
  }

  private async showStats(): Promise<void> {
    const s = await this.fetchStats();
    if (!s) {
      const why = this.status?.message ? ` (${this.status.message})` : "";
      void vscode.window.showWarningMessage(
        `dlm: the server is not running${why}; run \`dlm: Restart Server\`, and \`dlm: Show Log\` says why it stopped`,
      );
      return;
    }
    this.counts = s;
    this.renderStatus();
    const msg = statsMessage(s);
    this.log.info(msg);
    void vscode.window.showInformationMessage(msg);
  }

  // -- inline completions: shown / partially accepted ----------------------

  private noteShown(
    document: vscode.TextDocument,
    position: vscode.Position,
    result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined,
  ): void {
    // Every item is handed to VS Code: the server's answer first, then its alternatives, which
    // VS Code's inline suggestion widget cycles through (Alt+] / Alt+[).
    const items = Array.isArray(result) ? result : (result?.items ?? []);
    this.shownItems = items.map((item) => {
      const text = typeof item.insertText === "string" ? item.insertText : item.insertText.value;
      const range = item.range ?? new vscode.Range(position, position);
      const lspItem: Record<string, unknown> = {
        insertText: text,
        range: {
          start: { line: range.start.line, character: range.start.character },
          end: { line: range.end.line, character: range.end.character },
        },
      };
      if (item.command) lspItem.command = { title: item.command.title, command: item.command.command, arguments: item.command.arguments };
      return { uri: document.uri.toString(), startOffset: document.offsetAt(range.start), text, lspItem };
    });
    const first = this.shownItems[0];
    if (!first) return;
    this.log.debug(`inline item ${itemIdOf(items[0].command) ?? "(no id)"} at ${position.line}:${position.character}` +
      (items.length > 1 ? ` (+${items.length - 1} alternative(s))` : ""));
    // VS Code's stable API has no "shown" callback; an item handed to the editor is as close as we get
    // (the first: the one VS Code shows until the user cycles).
    void this.running()?.sendNotification("textDocument/didShowCompletion", { item: first.lspItem });
  }

  private async partialAccept(builtin: string): Promise<void> {
    await vscode.commands.executeCommand(builtin);
    const editor = vscode.window.activeTextEditor;
    const first = this.shownItems[0];
    if (!editor || !first || editor.document.uri.toString() !== first.uri) return;
    const cursor = editor.document.offsetAt(editor.selection.active);
    // the item the user cycled to: the one whose text starts with what was just inserted
    const inserted = cursor > first.startOffset
      ? editor.document.getText(new vscode.Range(editor.document.positionAt(first.startOffset), editor.selection.active))
      : "";
    const shown = this.shownItems[acceptedItemIndex(this.shownItems.map((i) => i.text), inserted)];
    const n = acceptedLength(shown.startOffset, cursor, shown.text);
    if (n > 0) {
      await this.running()?.sendNotification("textDocument/didPartiallyAcceptCompletion", {
        item: shown.lspItem,
        acceptedLength: n,
      });
      this.refreshStatsSoon();
    }
  }

  private async sendAccept(args: unknown[]): Promise<void> {
    const c = this.running();
    if (!c) return;
    try {
      await c.sendRequest(ExecuteCommandRequest.type, { command: ACCEPT_COMMAND, arguments: args });
    } catch (e) {
      this.log.warn(`${ACCEPT_COMMAND}: ${String(e)}`);
    }
  }

  // -- edit predictions ----------------------------------------------------

  private schedulePrediction(): void {
    if (this.predictionTimer) clearTimeout(this.predictionTimer);
    this.predictionCancel?.cancel();
    if (!this.settings.enable || !this.settings.editPredictions || !this.running()) return;
    this.predictionTimer = setTimeout(() => void this.requestPrediction(), this.settings.editPredictionDelayMs);
  }

  private async requestPrediction(): Promise<void> {
    const c = this.running();
    const editor = vscode.window.activeTextEditor;
    if (!c || !editor) return;
    const doc = editor.document;
    const pos = editor.selection.active;
    const cts = new vscode.CancellationTokenSource();
    this.predictionCancel = cts;
    let raw: unknown;
    try {
      raw = await c.sendRequest(
        "dlm/editPrediction",
        { textDocument: { uri: doc.uri.toString() }, position: { line: pos.line, character: pos.character } },
        cts.token,
      );
    } catch (e) {
      if (!cts.token.isCancellationRequested) this.log.warn(`dlm/editPrediction: ${String(e)}`);
      return;
    }
    if (cts.token.isCancellationRequested || vscode.window.activeTextEditor !== editor) return;
    let pred;
    try {
      pred = validateEditPrediction(raw);
    } catch (e) {
      this.log.warn(String(e));
      return;
    }
    // A prediction for an older version of the text would edit the wrong characters.
    if (!pred || pred.version !== doc.version) return;
    if (pred.fileJump) {
      // The next edit is in another file: a hint at the cursor's line (decorations, also where
      // inline edits are used: an inline edit can only show edits of this document); Tab opens it.
      const view = renderEditPrediction(pred, () => "");
      this.prediction = { uri: doc.uri.toString(), view, edits: [] };
      this.showPrediction(editor, view);
      return;
    }
    const lineText = (n: number) => (n < doc.lineCount ? doc.lineAt(n).text : "");
    let view: EditPredictionView;
    let inlineEdit: InlineEditData | null = null;
    try {
      view = renderEditPrediction(pred, lineText);
      if (this.display.mode === "inlineEdit") {
        const cur = editor.selection.active;
        inlineEdit = inlineEditFor(pred, { line: cur.line, character: cur.character }, lineText);
      }
    } catch (e) {
      this.log.warn(String(e));
      return;
    }
    if (!view.decorations.length) return;
    this.prediction = {
      uri: doc.uri.toString(),
      view,
      edits: pred.edits.map((e) => ({
        range: new vscode.Range(e.range.start.line, e.range.start.character, e.range.end.line, e.range.end.character),
        newText: e.newText,
      })),
      inlineEdit: inlineEdit ?? undefined,
    };
    if (inlineEdit) {
      // VS Code asks the inline-completion providers again; our middleware answers with the edit.
      this.triggeringInlineEdit = true;
      await vscode.commands.executeCommand("editor.action.inlineSuggest.trigger");
      this.triggeringInlineEdit = false;
    } else {
      this.showPrediction(editor, view); // decorations (no inline edits here, or an edit too large for one)
    }
  }

  /** The inline edit waiting for this document's current version, if any. */
  private pendingInlineEdit(document: vscode.TextDocument): InlineEditData | undefined {
    const p = this.prediction;
    if (!p?.inlineEdit || p.uri !== document.uri.toString() || p.view.version !== document.version) return undefined;
    return p.inlineEdit;
  }

  private inlineEditItem(e: InlineEditData, document: vscode.TextDocument): vscode.InlineCompletionItem {
    const toRange = (r: InlineEditData["range"]) =>
      document.validateRange(new vscode.Range(r.start.line, r.start.character, r.end.line, r.end.character));
    // Accepting runs dlm.acceptCompletion with the prediction id, like the decorations' Tab does.
    const item = new vscode.InlineCompletionItem(e.insertText, toRange(e.range), {
      title: "accept dlm edit prediction",
      command: ACCEPT_COMMAND,
      arguments: [e.id],
    }) as ProposedInlineItem;
    item.isInlineEdit = true;
    item.showInlineEditMenu = true;
    if (e.displayLocation) {
      const kinds = displayLocationKinds();
      item.displayLocation = { range: toRange(e.displayLocation.range), label: e.displayLocation.label };
      if (kinds) item.displayLocation.kind = e.displayLocation.kind === "label" ? kinds.Label : kinds.Code;
    }
    return item;
  }

  private showPrediction(editor: vscode.TextEditor, view: EditPredictionView): void {
    const replaced: vscode.DecorationOptions[] = [];
    const added: vscode.DecorationOptions[] = [];
    for (const d of view.decorations) {
      const hover = new vscode.MarkdownString().appendText("dlm edit (Tab applies, Esc dismisses):").appendCodeblock(d.hover);
      if (d.kind !== "insert") {
        replaced.push({
          range: new vscode.Range(d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character),
          hoverMessage: hover,
        });
      }
      if (d.after) {
        const end = editor.document.lineAt(Math.min(d.anchorLine, editor.document.lineCount - 1)).range.end;
        added.push({
          range: new vscode.Range(end, end),
          hoverMessage: hover,
          renderOptions: { after: { contentText: `→ ${d.after}` } },
        });
      }
    }
    if (view.jump) {
      // far from the cursor: a "jump to" hint at the cursor's line (Tab applies the edit there)
      const end = editor.document.lineAt(editor.selection.active.line).range.end;
      added.push({ range: new vscode.Range(end, end), renderOptions: { after: { contentText: jumpText(view.jump) } } });
    }
    if (view.fileJump) {
      // in another file: a "jump to" hint at the cursor's line (Tab opens the file there)
      const end = editor.document.lineAt(editor.selection.active.line).range.end;
      added.push({
        range: new vscode.Range(end, end),
        hoverMessage: new vscode.MarkdownString().appendText(
          `dlm: next edit in ${view.fileJump.path} (Tab opens it, Esc dismisses)`,
        ),
        renderOptions: { after: { contentText: fileJumpText(view.fileJump) } },
      });
    }
    editor.setDecorations(this.replaceDeco, replaced);
    editor.setDecorations(this.newTextDeco, added);
    void vscode.commands.executeCommand("setContext", "dlm.editPredictionVisible", true);
  }

  clearPrediction(): void {
    if (!this.prediction) return;
    const wasInline = !!this.prediction.inlineEdit;
    this.prediction = undefined;
    if (wasInline) {
      // VS Code owns the inline edit's display; it drops it when the text changes, Esc hides it.
      return;
    }
    for (const e of vscode.window.visibleTextEditors) {
      e.setDecorations(this.replaceDeco, []);
      e.setDecorations(this.newTextDeco, []);
    }
    void vscode.commands.executeCommand("setContext", "dlm.editPredictionVisible", false);
  }

  private async applyPrediction(): Promise<void> {
    const p = this.prediction;
    const editor = vscode.window.activeTextEditor;
    if (!p || !editor || editor.document.uri.toString() !== p.uri || editor.document.version !== p.view.version) {
      this.clearPrediction();
      return;
    }
    if (p.view.fileJump) {
      await this.openFileJump(p.view.fileJump);
      return;
    }
    const doc = editor.document;
    // Where the cursor goes: the end of the last edit's new text, in the edited document.
    const sorted = [...p.edits].sort((a, b) => doc.offsetAt(a.range.start) - doc.offsetAt(b.range.start));
    let delta = 0;
    for (const e of sorted.slice(0, -1)) delta += e.newText.length - (doc.offsetAt(e.range.end) - doc.offsetAt(e.range.start));
    const last = sorted[sorted.length - 1];
    const target = doc.offsetAt(last.range.start) + delta + last.newText.length;
    this.clearPrediction();
    const ok = await editor.edit((b) => {
      for (const e of p.edits) b.replace(e.range, e.newText);
    });
    if (!ok) {
      this.log.warn("applying the edit prediction failed (the document changed); ask again by moving the cursor");
      return;
    }
    const pos = editor.document.positionAt(target);
    editor.selection = new vscode.Selection(pos, pos);
    await this.sendAccept([p.view.id]);
  }

  /**
   * Tab on a "jump to another file" hint: open the file with the cursor where its edit starts.
   * Nothing is edited and nothing is accepted on the server: in that editor the usual trigger
   * (active editor / selection changed) asks dlm/editPrediction, which answers the edit there.
   */
  private async openFileJump(j: NonNullable<EditPredictionView["fileJump"]>): Promise<void> {
    this.clearPrediction();
    const at = new vscode.Position(j.position.line, j.position.character);
    try {
      const editor = await vscode.window.showTextDocument(vscode.Uri.parse(j.uri, true), {
        selection: new vscode.Range(at, at),
      });
      editor.revealRange(editor.selection, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    } catch (e) {
      const msg =
        `cannot open ${j.path} (${j.uri}) for its next edit: ${e instanceof Error ? e.message : String(e)}; ` +
        "it may have been deleted or moved: open it yourself, or keep typing and the next hint will follow";
      this.log.warn(msg);
      void vscode.window.showWarningMessage(`dlm: ${msg}`);
      return;
    }
    // The active-editor change schedules this too; when the file was already the active
    // editor's (no change event), the selection change does. Asked here as well so the
    // edit is asked for whichever event VS Code sends (one request: the timer is shared).
    this.schedulePrediction();
  }

  dispose(): void {
    if (this.predictionTimer) clearTimeout(this.predictionTimer);
    if (this.statsTimer) clearTimeout(this.statsTimer);
    void this.stop();
    for (const d of this.disposables) d.dispose();
  }
}

let ext: DlmExtension | undefined;

export async function activate(ctx: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel("dlm", { log: true });
  ctx.subscriptions.push(log);
  ext = new DlmExtension(log);
  ext.register(ctx);
  await ext.start();
}

export async function deactivate(): Promise<void> {
  ext?.dispose();
  ext = undefined;
}

// Pure logic of the extension: no `vscode` import, so node's test runner can
// load it without an editor (see src/test/logic.test.ts).

export type Device = "auto" | "cpu" | "cuda";

/** The extension's settings, as read from the `dlm.*` configuration. */
export interface DlmSettings {
  enable: boolean;
  serverPath: string;
  serverArgs: string[];
  model: string;
  device: Device;
  remoteAddress: string;
  remoteTokenFile: string;
  remoteTls: boolean;
  editPredictions: boolean;
  editPredictionDelayMs: number;
  editPredictionDisplay: EditPredictionDisplaySetting;
  minConfidence: number | null; // null: the server's default (chosen by measurement)
  deadlineMs: number | null; // null: the server's default (250 ms from the keystroke)
  engine: Record<string, unknown> | null; // a hosted engine (docs/engines.md); null: the embedded model
}

export const DEFAULT_SETTINGS: DlmSettings = {
  enable: true,
  serverPath: "dlm-lsp",
  serverArgs: [],
  model: "",
  device: "auto",
  remoteAddress: "",
  remoteTokenFile: "",
  remoteTls: false,
  editPredictions: true, // the edit memory's next edits (docs/next-edits.md: the measured figures)
  editPredictionDelayMs: 300,
  editPredictionDisplay: "auto",
  minConfidence: null,
  deadlineMs: null,
  engine: null,
};

/**
 * Settings -> the server's initializationOptions (docs/configuration.md), sent at start: a change restarts the server. Unset numbers are
 * left out so that the server's measured defaults apply; edit predictions are asked for
 * only when the user wants them shown (the server keeps them off otherwise).
 */
export function initializationOptions(s: DlmSettings): Record<string, unknown> {
  const out: Record<string, unknown> = { editPredictions: s.editPredictions };
  if (s.minConfidence !== null && Number.isFinite(s.minConfidence)) {
    out.minConfidence = Math.min(1, Math.max(0, s.minConfidence));
  }
  if (s.deadlineMs !== null && Number.isFinite(s.deadlineMs) && s.deadlineMs > 0) out.deadlineMs = s.deadlineMs;
  // dlm.engine is read from the user's settings alone (userOnlyValue): marked so, the server takes it;
  // an engine object without "scope": "user" (a workspace's) is ignored there (docs/engines.md)
  if (s.engine !== null && typeof s.engine === "object" && !Array.isArray(s.engine)) {
    out.engine = { ...s.engine, scope: "user" };
  }
  return out;
}

export interface ServerCommand {
  command: string;
  args: string[];
}

/** A setting that cannot become a command line, with what to do about it. */
export class SettingsError extends Error {}

/** `host:port`, `[v6]:port`; the port must be 1..65535. */
export function parseRemoteAddress(address: string): { host: string; port: number } {
  const text = address.trim();
  const m = /^(\[[^\]]+\]|[^:\s]+):(\d+)$/.exec(text);
  if (!m) {
    throw new SettingsError(
      `dlm.remote.address "${address}" is not HOST:PORT; set it like "gpu-box:7878" or leave it empty to run locally`,
    );
  }
  const port = Number(m[2]);
  if (!(port >= 1 && port <= 65535)) {
    throw new SettingsError(`dlm.remote.address "${address}": port ${m[2]} is outside 1..65535`);
  }
  return { host: m[1], port };
}

/**
 * Settings -> the `dlm-lsp` command line (docs/architecture.md §7/§8):
 * `dlm-lsp --stdio [--model DIR] [--device D] [--remote HOST:PORT --token-file F --tls] [extra args]`.
 * With a remote address the model runs on the GPU box, so --model/--device are not sent.
 */
export function buildServerCommand(s: DlmSettings): ServerCommand {
  const command = s.serverPath.trim();
  if (!command) {
    throw new SettingsError(
      'dlm.server.path is empty; set it to "dlm-lsp" (on PATH) or to the full path of the dlm-lsp executable',
    );
  }
  const args = ["--stdio"];
  if (s.remoteAddress.trim()) {
    parseRemoteAddress(s.remoteAddress);
    args.push("--remote", s.remoteAddress.trim());
    if (s.remoteTokenFile.trim()) args.push("--token-file", s.remoteTokenFile.trim());
    if (s.remoteTls) args.push("--tls");
  } else {
    if (s.model.trim()) args.push("--model", s.model.trim());
    if (!["auto", "cpu", "cuda"].includes(s.device)) {
      throw new SettingsError(`dlm.device "${s.device}" is not one of auto, cpu, cuda`);
    }
    if (s.device !== "auto") args.push("--device", s.device);
  }
  for (const a of s.serverArgs) {
    if (typeof a !== "string") throw new SettingsError("dlm.server.args must be a list of strings");
    args.push(a);
  }
  return { command, args };
}

/**
 * Where `command` (dlm.server.path) runs from: itself when it names a path, else the first match
 * on `pathEnv` (with PATHEXT's extensions on Windows); null when there is no such executable.
 * `isExecutable(p)` says whether p is an executable file.
 */
export function findExecutable(
  command: string,
  pathEnv: string,
  isExecutable: (p: string) => boolean,
  platform: string = "linux",
  pathExt: string = ".COM;.EXE;.BAT;.CMD",
): string | null {
  const win = platform === "win32";
  // Windows file names ignore case, the isExecutable check may not: try ".EXE" and ".exe".
  const exts = win ? ["", ...pathExt.split(";").filter((e) => e).flatMap((e) => [e.toLowerCase(), e])] : [""];
  const hasDir = command.includes("/") || (win && command.includes("\\"));
  const dirs = hasDir ? [""] : pathEnv.split(win ? ";" : ":").filter((d) => d);
  for (const dir of dirs) {
    const base = dir ? `${dir.replace(/[\\/]+$/, "")}${win ? "\\" : "/"}${command}` : command;
    for (const ext of exts) {
      if (isExecutable(base + ext)) return base + ext;
    }
  }
  return null;
}

/** What to tell the user when dlm.server.path names no executable (before starting anything). */
export function serverNotFoundMessage(command: string): string {
  const hasDir = command.includes("/") || command.includes("\\");
  return hasDir
    ? `cannot start the server: dlm.server.path is "${command}", which is not an executable file`
    : `cannot start the server: "${command}" (dlm.server.path) is not on the PATH VS Code started with`;
}

/** Which settings changes need a server restart (the command line changed). */
export function needsRestart(a: DlmSettings, b: DlmSettings): boolean {
  const x = buildServerCommandOrNull(a);
  const y = buildServerCommandOrNull(b);
  const optionsChanged = JSON.stringify(initializationOptions(a)) !== JSON.stringify(initializationOptions(b));
  return optionsChanged || JSON.stringify(x) !== JSON.stringify(y);
}

function buildServerCommandOrNull(s: DlmSettings): ServerCommand | string {
  try {
    return buildServerCommand(s);
  } catch (e) {
    return String(e);
  }
}

// ---------------------------------------------------------------------------
// dlm/status -> status bar

/** The workspace index's part of `dlm/status` (the server's lsp/workspace_index.py). */
export interface DlmIndexStatus {
  state: "off" | "loading" | "indexing" | "ready" | "failed";
  files?: number; // in the index now
  tokens?: number;
  done?: number; // files gone through by the build in progress ...
  total?: number | null; // ... of the files found (null while it looks for them)
  message?: string; // why it failed or is off, or what a ready index lacks
  reason?: string; // why it failed or is off ("" otherwise)
  text?: string; // "indexing 38/77 files", "index: ready (77 files)", "index failed: <why>"
}

export interface DlmStatus {
  state: "loading" | "ready" | "failed" | "disconnected"; // the model's
  ready?: boolean; // the model answers and the index is done (built, loaded, failed or off)
  text?: string; // the server's status line
  index?: DlmIndexStatus;
  device?: string;
  model?: string;
  message?: string;
  p50_ms?: number | null;
  p95_ms?: number | null;
  requests?: number;
  accepted?: number;
  shown?: number;
  offered?: number; // suggestions the server handed to the editor
  held_back?: number; // answers it kept back, by reason in held_back_by
  held_back_by?: Record<string, number>;
}

/** The most frequent reason the server held answers back ("low confidence"), or "" when none. */
export function heldBackReason(st: DlmStatus): string {
  let best = "";
  let most = 0;
  for (const [k, v] of Object.entries(st.held_back_by ?? {})) {
    if (v > most) {
      best = k;
      most = v;
    }
  }
  return best;
}

/**
 * The counters of a `dlm/stats` answer the extension shows (the server's lsp/stats.py; the
 * gate's held-back suggestions are `gated_<reason>` counters, one per reason).
 */
export interface StatsSummary {
  requests: number;
  shown: number;
  heldBack: number;
  /** reason -> count, e.g. {low_confidence: 4, late: 1}; only reasons that held something back. */
  heldBackBy: Record<string, number>;
  accepted: number;
  partiallyAccepted: number;
  p50Ms: number | null;
  p95Ms: number | null;
}

const GATED = "gated_";

/** A `dlm/stats` answer -> the counters shown to the user; null when it is not an object. */
export function summarizeStats(raw: unknown): StatsSummary | null {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) return null;
  const r = raw as Record<string, unknown>;
  const n = (k: string) => (typeof r[k] === "number" && Number.isFinite(r[k]) ? (r[k] as number) : 0);
  const ms = (k: string) => (typeof r[k] === "number" && Number.isFinite(r[k]) ? (r[k] as number) : null);
  const heldBackBy: Record<string, number> = {};
  for (const k of Object.keys(r).sort()) {
    if (k.startsWith(GATED) && n(k) > 0) heldBackBy[k.slice(GATED.length)] = n(k);
  }
  return {
    requests: n("requests"),
    shown: n("shown"),
    heldBack: Object.values(heldBackBy).reduce((a, b) => a + b, 0),
    heldBackBy,
    accepted: n("accepted"),
    partiallyAccepted: n("partially_accepted"),
    p50Ms: ms("p50_ms"),
    p95Ms: ms("p95_ms"),
  };
}

/** "shown 3, held back 5 (low confidence 4, late 1), accepted 1, partially accepted 2". */
export function countsLine(s: StatsSummary): string {
  const why = Object.entries(s.heldBackBy)
    .map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`)
    .join(", ");
  return (
    `shown ${s.shown}, held back ${s.heldBack}${why ? ` (${why})` : ""}, accepted ${s.accepted}, ` +
    `partially accepted ${s.partiallyAccepted}`
  );
}

/** The `dlm: Show Statistics` message. */
export function statsMessage(s: StatsSummary): string {
  const lat = s.p50Ms === null ? "no model run yet" : `latency p50 ${fmtMs(s.p50Ms)}, p95 ${fmtMs(s.p95Ms)}`;
  return `dlm statistics: requests ${s.requests}, ${countsLine(s)}; ${lat}`;
}

export interface StatusBarData {
  text: string;
  tooltip: string;
  error: boolean;
}

const STATE_ICON: Record<string, string> = {
  loading: "$(loading~spin)",
  ready: "$(sparkle)",
  failed: "$(error)",
  disconnected: "$(debug-disconnect)",
};

/**
 * The status bar item: state and p50 latency in the text ("indexing 38/77 files" instead while the
 * workspace index is built; "index failed" / "index off" after it when so); in the tooltip the
 * model, device, latency, what the gate did with the suggestions (`counts`, from dlm/stats, when
 * known) and the index's line with its reasons.
 */
export function statusBarData(st: DlmStatus | null, enabled: boolean, counts: StatsSummary | null = null): StatusBarData {
  if (!st) {
    return { text: "$(loading~spin) dlm", tooltip: "dlm: starting the server", error: false };
  }
  const index = st.index && typeof st.index.text === "string" && st.index.text ? st.index : null;
  // "ready" only once the model answers and the index is built: until then, the index's count
  const building = st.state === "ready" && index !== null && (index.state === "loading" || index.state === "indexing");
  const icon = enabled ? (building ? STATE_ICON.loading : (STATE_ICON[st.state] ?? "$(question)")) : "$(circle-slash)";
  let text = `${icon} dlm`;
  if (building) text += ` ${index.text}`;
  else if (st.state === "ready" && typeof st.p50_ms === "number") text += ` ${Math.round(st.p50_ms)} ms`;
  if (!building && st.state === "ready" && typeof st.offered === "number") {
    // what the server offered and what it held back, and why: "ready" alone hid that it showed nothing
    text += ` · offered ${st.offered}`;
    if (st.held_back) text += `, held back ${st.held_back} (${heldBackReason(st)})`;
  }
  if (st.state !== "ready") text += ` ${st.state}`;
  if (index && (index.state === "failed" || index.state === "off")) text += ` · index ${index.state}`; // why: tooltip
  const lines = [
    `dlm: ${building ? index.text : st.state}${enabled ? "" : " (suggestions off)"}`,
    st.model ? `model: ${st.model}` : "",
    st.device ? `device: ${st.device}` : "",
    typeof st.p50_ms === "number" ? `latency p50 ${fmtMs(st.p50_ms)}, p95 ${fmtMs(st.p95_ms)}` : "",
    counts
      ? countsLine(counts)
      : st.requests !== undefined
        ? `requests ${st.requests}, shown ${st.shown ?? 0}, held back -, accepted ${st.accepted ?? 0}`
        : "",
    st.message ?? "",
    index && !building ? index.text : "",
    "click: toggle suggestions",
  ];
  return { text, tooltip: lines.filter((l) => l).join("\n"), error: st.state === "failed" };
}

function fmtMs(v: number | null | undefined): string {
  return typeof v === "number" ? `${Math.round(v)} ms` : "-";
}

// ---------------------------------------------------------------------------
// dlm/editPrediction -> decoration data

export interface Pos {
  line: number;
  character: number;
}
export interface Range {
  start: Pos;
  end: Pos;
}
export interface TextEdit {
  range: Range;
  newText: string;
}
/** The server's "jump to" hint for an edit far from the cursor (docs/next-edits.md). */
export interface JumpHint {
  position: Pos; // where the edit starts
  lines: number; // how far from the cursor (negative: above)
  label: string; // what the edit does ("rename foo → bar")
}

/**
 * The server's "jump to another file" hint: the document asked about has no next edit, another
 * file of the workspace has (docs/next-edits.md, "Another file"). It comes with no edits: Tab opens `uri` at
 * `position`, and the server answers the edit itself when the editor asks for that file.
 */
export interface FileJumpHint {
  uri: string; // the other file (it need not be open in the editor)
  path: string; // for display: relative to the workspace root, else the uri's file name
  position: Pos; // where the edit starts in that file
  label: string; // what the edit does ("rename count → tally")
}

export interface EditPrediction {
  id: string;
  version: number;
  edits: TextEdit[]; // empty exactly when fileJump is set
  jump?: JumpHint;
  fileJump?: FileJumpHint;
}

/** One decoration: text struck out in `range` and/or `after` shown at the end of `anchorLine`. */
export interface EditDecoration {
  kind: "insert" | "delete" | "replace";
  range: Range; // the text the edit replaces (empty for an insertion)
  anchorLine: number; // where the new text is shown
  after: string; // the new text, one line, shortened; "" for a pure deletion
  hover: string; // the full new text for the hover
}

export interface EditPredictionView {
  id: string;
  version: number;
  decorations: EditDecoration[];
  firstLine: number; // the line to reveal / jump to
  jump?: JumpHint; // far from the cursor: shown as a hint at the cursor line
  fileJump?: FileJumpHint; // in another file: no decorations, a hint at the cursor line
}

const MAX_AFTER = 80;

/** Checks a dlm/editPrediction answer; null for "nothing to show". Throws on malformed answers. */
export function validateEditPrediction(raw: unknown): EditPrediction | null {
  if (raw === null || raw === undefined) return null;
  const r = raw as Record<string, unknown>;
  if (typeof r !== "object" || typeof r.id !== "string" || typeof r.version !== "number" || !Array.isArray(r.edits)) {
    throw new Error(`dlm/editPrediction answered ${JSON.stringify(raw)}; expected {id, version, edits[]}`);
  }
  const edits: TextEdit[] = [];
  for (const e of r.edits as unknown[]) {
    const ed = e as TextEdit;
    if (!ed || typeof ed.newText !== "string" || !isRange(ed.range)) {
      throw new Error(`dlm/editPrediction edit ${JSON.stringify(e)} is not {range, newText}`);
    }
    edits.push({ range: ed.range, newText: ed.newText });
  }
  if (!edits.length) {
    // No edit here: the only thing such an answer can carry is a jump to another file. A
    // malformed one is ignored (nothing to show), like an answer without edits.
    const fileJump = validateFileJump(r.jump);
    return fileJump ? { id: r.id, version: r.version, edits, fileJump } : null;
  }
  const out: EditPrediction = { id: r.id, version: r.version, edits };
  const j = r.jump as JumpHint | undefined; // optional: a malformed hint is ignored, the edit kept
  if (j && isPos(j.position) && Number.isInteger(j.lines) && typeof j.label === "string") {
    out.jump = { position: j.position, lines: j.lines, label: j.label };
  }
  return out;
}

/** The text of a "jump to" hint: where the edit is and what it does. */
export function jumpText(j: JumpHint): string {
  const arrow = j.lines < 0 ? "↑" : "↓";
  return `⇥ ${arrow} line ${j.position.line + 1}: ${oneLine(j.label)}`;
}

/** A URI: a scheme ("file:", "untitled:") and something after it. */
const URI_RE = /^[A-Za-z][A-Za-z0-9+.-]*:./;

/**
 * A `jump` to another file ({uri, path?, position, label}) as the client uses it; null when it is
 * not one (no uri, a bad position, no label). `path` falls back to the uri's file name.
 */
export function validateFileJump(raw: unknown): FileJumpHint | null {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) return null;
  const j = raw as Record<string, unknown>;
  if (typeof j.uri !== "string" || !URI_RE.test(j.uri) || !isPos(j.position) || typeof j.label !== "string") return null;
  const path = typeof j.path === "string" && j.path.trim() ? j.path : uriBasename(j.uri);
  return { uri: j.uri, path, position: { line: j.position.line, character: j.position.character }, label: j.label };
}

/** The last segment of a uri's path, percent-decoded ("file:///a/b%20c.py" -> "b c.py"). */
export function uriBasename(uri: string): string {
  const path = uri.replace(/[?#].*$/, "").replace(/[/\\]+$/, "");
  const last = path.slice(Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\")) + 1) || path;
  try {
    return decodeURIComponent(last);
  } catch {
    return last; // a stray "%": show it as it is
  }
}

/** The text of a "jump to another file" hint: `⇥ pkg/b.py:13: rename count → tally`. */
export function fileJumpText(j: FileJumpHint): string {
  return `⇥ ${oneLine(j.path)}:${j.position.line + 1}: ${oneLine(j.label)}`;
}

function isRange(r: unknown): r is Range {
  const x = r as Range;
  return !!x && isPos(x.start) && isPos(x.end);
}
function isPos(p: unknown): p is Pos {
  const x = p as Pos;
  return !!x && Number.isInteger(x.line) && Number.isInteger(x.character) && x.line >= 0 && x.character >= 0;
}

function oneLine(text: string): string {
  const lines = text.split("\n");
  let s = lines[0];
  if (lines.length > 1) s += ` ⏎ … (+${lines.length - 1} lines)`;
  if (s.length > MAX_AFTER) s = s.slice(0, MAX_AFTER - 1) + "…";
  return s;
}

/**
 * How to show a prediction: each edit becomes a decoration that strikes out
 * the replaced text and shows the new text after its line. `lineText(n)`
 * returns line n of the document (used to drop edits that change nothing).
 */
export function renderEditPrediction(p: EditPrediction, lineText: (line: number) => string): EditPredictionView {
  const decorations: EditDecoration[] = [];
  for (const e of p.edits) {
    const { start, end } = e.range;
    if (end.line < start.line || (end.line === start.line && end.character < start.character)) {
      throw new Error(
        `dlm/editPrediction edit range ${JSON.stringify(e.range)} ends before it starts; the server sent a bad edit`,
      );
    }
    const empty = start.line === end.line && start.character === end.character;
    if (empty && e.newText === "") continue;
    if (start.line === end.line && lineText(start.line).slice(start.character, end.character) === e.newText) {
      continue; // replaces text with itself
    }
    const kind = empty ? "insert" : e.newText === "" ? "delete" : "replace";
    decorations.push({
      kind,
      range: e.range,
      anchorLine: end.line,
      after: kind === "delete" ? "" : oneLine(e.newText),
      hover: e.newText,
    });
  }
  const firstLine = decorations.length ? Math.min(...decorations.map((d) => d.range.start.line)) : 0;
  return {
    id: p.id,
    version: p.version,
    decorations,
    firstLine,
    ...(p.jump ? { jump: p.jump } : {}),
    ...(p.fileJump ? { fileJump: p.fileJump } : {}),
  };
}

// ---------------------------------------------------------------------------
// partial accept of an inline completion

/**
 * How many characters of a shown item the user has accepted so far, measured
 * from the document after VS Code's accept-word/line command ran: the cursor
 * moved from the item's start to `cursorOffset`. Clamped to the item text.
 */
export function acceptedLength(itemStartOffset: number, cursorOffset: number, itemText: string): number {
  return Math.max(0, Math.min(itemText.length, cursorOffset - itemStartOffset));
}

/**
 * Which item of an inline list (the server's answer, then its alternatives, all inserted at the
 * cursor) a partial accept took its text from: the first whose text starts with the text
 * `inserted` since the list was shown (VS Code shows one item at a time and the user may have
 * cycled to another). 0 (the answer) when none does.
 */
export function acceptedItemIndex(itemTexts: string[], inserted: string): number {
  if (!inserted) return 0;
  const i = itemTexts.findIndex((t) => t.startsWith(inserted));
  return i < 0 ? 0 : i;
}

/**
 * An inline completion's text without the blank lines it ends with: ghost text never ends in
 * empty lines (VS Code draws them as nothing, and Tab would insert them). When the line goes on
 * after the inserted text (`restOfLine`, the text after the item's range on its last line, is
 * not blank), one final newline is kept: the insertion then ends a line of its own.
 */
export function trimTrailingBlankLines(text: string, restOfLine: string): string {
  const trimmed = text.replace(/(\r?\n[ \t]*)+$/, "");
  if (trimmed === text || !restOfLine.trim()) return trimmed;
  return trimmed + (text.slice(trimmed.length).startsWith("\r\n") ? "\r\n" : "\n");
}

/** The item id the server put in InlineCompletionItem.command.arguments[0] (dlm.acceptCompletion). */
export function itemIdOf(command: { command?: string; arguments?: unknown[] } | undefined): string | null {
  if (!command || command.command !== "dlm.acceptCompletion" || !command.arguments?.length) return null;
  const id = command.arguments[0];
  return typeof id === "string" || typeof id === "number" ? String(id) : null;
}

// ---------------------------------------------------------------------------
// edit predictions as inline edits (proposed API) or decorations

/** The proposal that adds `isInlineEdit` / `displayLocation` to InlineCompletionItem. */
export const INLINE_EDIT_PROPOSAL = "inlineCompletionsAdditions";

/**
 * The oldest VS Code whose `inlineCompletionsAdditions` proposal has `isInlineEdit`
 * (older builds ignore the field and would drop an edit away from the cursor).
 */
export const MIN_INLINE_EDIT_VERSION = "1.99.0";

/**
 * `dlm.editPredictionDisplay`: `auto` uses inline edits where VS Code has them,
 * `inlineEdit` uses them without checking, `decorations` never does.
 */
export type EditPredictionDisplaySetting = "auto" | "inlineEdit" | "decorations";

export interface EditorCapabilities {
  /** vscode.version, e.g. "1.101.2" or "1.102.0-insider". */
  version: string;
  /**
   * The extension's effective package.json `enabledApiProposals`: VS Code empties the
   * list when it does not allow proposals for the extension (stable build without
   * `--enable-proposed-api`), so a declared proposal is not enough.
   */
  enabledApiProposals: readonly string[] | undefined;
  /** Whether `vscode.InlineCompletionDisplayLocationKind` exists (displayLocation takes a kind). */
  hasDisplayLocationKind: boolean;
  /**
   * Whether a call gated by the proposal succeeded (registering an inline completion
   * provider with metadata, which VS Code refuses without the proposal); undefined: not probed.
   */
  proposalProbe?: boolean;
}

export interface EditPredictionDisplay {
  mode: "inlineEdit" | "decorations";
  why: string;
}

/** [major, minor, patch] of "1.99.3-insider"; null when it is not a version. */
export function parseVersion(v: string): [number, number, number] | null {
  const m = /^(\d+)\.(\d+)(?:\.(\d+))?/.exec(v.trim());
  return m ? [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)] : null;
}

/** a >= b for dotted versions; an unparsable `a` counts as older. */
export function versionAtLeast(a: string, b: string): boolean {
  const x = parseVersion(a);
  const y = parseVersion(b);
  if (!x || !y) return false;
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] > y[i];
  return true;
}

/** How to show edit predictions in the running VS Code (decided once, at start). */
export function chooseEditPredictionDisplay(
  setting: EditPredictionDisplaySetting,
  caps: EditorCapabilities,
): EditPredictionDisplay {
  if (setting === "decorations") return { mode: "decorations", why: "dlm.editPredictionDisplay is decorations" };
  if (setting === "inlineEdit") {
    // no checks: for builds the detection gets wrong (VS Code ignores the fields where it lacks them)
    return { mode: "inlineEdit", why: "dlm.editPredictionDisplay is inlineEdit" };
  }
  const missing: string[] = [];
  if (!versionAtLeast(caps.version, MIN_INLINE_EDIT_VERSION)) {
    missing.push(`VS Code ${caps.version} is older than ${MIN_INLINE_EDIT_VERSION}`);
  }
  if (!(caps.enabledApiProposals ?? []).includes(INLINE_EDIT_PROPOSAL)) {
    missing.push(
      `the ${INLINE_EDIT_PROPOSAL} API proposal is not enabled for this extension ` +
        "(start VS Code with --enable-proposed-api dlm-lsp.dlm-lsp, or list the extension under " +
        '"enable-proposed-api" in argv.json)',
    );
  }
  if (caps.proposalProbe === false) missing.push(`VS Code refused a call of the ${INLINE_EDIT_PROPOSAL} proposal`);
  if (missing.length) return { mode: "decorations", why: `inline edits unavailable: ${missing.join("; ")}` };
  const kind = caps.hasDisplayLocationKind ? "" : " (displayLocation without a kind in this build)";
  return { mode: "inlineEdit", why: `inline edits (proposed ${INLINE_EDIT_PROPOSAL} API)${kind}` };
}

/** An edit prediction as one InlineCompletionItem (plain data; extension.ts makes the vscode objects). */
export interface InlineEditData {
  id: string;
  version: number;
  range: Range; // the text replaced: from the first edit's start to the last edit's end
  insertText: string;
  /** Set when the edit is away from the cursor: where VS Code draws it, with a label. */
  displayLocation?: { range: Range; kind: "code" | "label"; label: string };
}

/** Edits spanning more lines than this are drawn as decorations (one inline edit would be a huge diff). */
export const MAX_INLINE_EDIT_LINES = 40;

function cmpPos(a: Pos, b: Pos): number {
  return a.line !== b.line ? a.line - b.line : a.character - b.character;
}

/**
 * The edits of a prediction merged into one replacement (an inline completion item has one
 * range): the covered text with every edit applied. `lineText(n)` returns line n of the
 * document. null when there is nothing to show, when edits overlap, or when the span is
 * longer than MAX_INLINE_EDIT_LINES (the caller then draws decorations).
 */
export function inlineEditFor(p: EditPrediction, cursor: Pos, lineText: (line: number) => string): InlineEditData | null {
  const view = renderEditPrediction(p, lineText); // validates ranges and drops no-op edits
  if (!view.decorations.length) return null;
  const edits = view.decorations
    .map((d) => ({ range: d.range, newText: d.hover }))
    .sort((a, b) => cmpPos(a.range.start, b.range.start));
  for (let i = 1; i < edits.length; i++) {
    if (cmpPos(edits[i].range.start, edits[i - 1].range.end) < 0) return null; // overlapping edits
  }
  const start = edits[0].range.start;
  const end = edits.reduce((e, x) => (cmpPos(x.range.end, e) > 0 ? x.range.end : e), edits[0].range.end);
  if (end.line - start.line + 1 > MAX_INLINE_EDIT_LINES) return null;
  // The covered text, as the document has it: lines start..end joined with "\n".
  const textBetween = (a: Pos, b: Pos): string => {
    if (a.line === b.line) return lineText(a.line).slice(a.character, b.character);
    const parts = [lineText(a.line).slice(a.character)];
    for (let l = a.line + 1; l < b.line; l++) parts.push(lineText(l));
    parts.push(lineText(b.line).slice(0, b.character));
    return parts.join("\n");
  };
  let out = "";
  let at = start;
  for (const e of edits) {
    out += textBetween(at, e.range.start) + e.newText;
    at = e.range.end;
  }
  out += textBetween(at, end);
  const range = { start, end };
  const data: InlineEditData = { id: p.id, version: p.version, range, insertText: out };
  // Near the cursor VS Code draws the edit in place; away from it, point at the edit's lines.
  if (cursor.line < start.line - 1 || cursor.line > end.line + 1) {
    const label = p.jump ? jumpText(p.jump) : `dlm: edit at line ${start.line + 1}`;
    data.displayLocation = { range, kind: "code", label };
  }
  return data;
}

/**
 * What the inline-completion provider returns when an edit prediction is pending:
 * a completion at the cursor wins (it is what the user is typing); the inline edit
 * is shown when the server has no completion, or when the request is our own
 * trigger for the edit (then the server is not asked again).
 */
export function inlineResultSource(opts: {
  editPending: boolean;
  ourTrigger: boolean;
  completionCount: number | null; // null: the server was not asked
}): "completions" | "inlineEdit" | "none" {
  if (opts.editPending && opts.ourTrigger) return "inlineEdit";
  if (opts.completionCount) return "completions";
  return opts.editPending ? "inlineEdit" : "none";
}

/**
 * Settings that choose what runs (the server binary and its arguments, the checkpoint), where code is
 * sent (the remote address, TLS) or which credentials are read (the token file). package.json declares
 * them `"scope": "machine"`, and they are read from the user's settings only: a project's
 * `.vscode/settings.json` cannot plant them.
 */
export const USER_ONLY_SETTINGS = ["server.path", "server.args", "model", "remote.address", "remote.tokenFile", "remote.tls"] as const;

/** What `WorkspaceConfiguration.inspect` returns, the part `userOnlyValue` reads. */
export interface InspectedSetting<T> {
  defaultValue?: T;
  globalValue?: T;
  workspaceValue?: T;
  workspaceFolderValue?: T;
}

/** A user-only setting's value: the user's (global) value, else the default; workspace values are ignored. */
export function userOnlyValue<T>(inspected: InspectedSetting<T> | undefined, fallback: T): T {
  if (inspected?.globalValue !== undefined) return inspected.globalValue;
  if (inspected?.defaultValue !== undefined) return inspected.defaultValue;
  return fallback;
}

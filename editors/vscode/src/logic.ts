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
  editPredictions: true,
  editPredictionDelayMs: 300,
};

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
 * Settings -> the `dlm-lsp` command line (DESIGN §7/§8):
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

/** Which settings changes need a server restart (the command line changed). */
export function needsRestart(a: DlmSettings, b: DlmSettings): boolean {
  const x = buildServerCommandOrNull(a);
  const y = buildServerCommandOrNull(b);
  return JSON.stringify(x) !== JSON.stringify(y);
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

export interface DlmStatus {
  state: "loading" | "ready" | "failed" | "disconnected";
  device?: string;
  model?: string;
  message?: string;
  p50_ms?: number | null;
  p95_ms?: number | null;
  requests?: number;
  accepted?: number;
  shown?: number;
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

export function statusBarData(st: DlmStatus | null, enabled: boolean): StatusBarData {
  if (!st) {
    return { text: "$(loading~spin) dlm", tooltip: "dlm: starting the server", error: false };
  }
  const icon = enabled ? (STATE_ICON[st.state] ?? "$(question)") : "$(circle-slash)";
  let text = `${icon} dlm`;
  if (st.state === "ready" && typeof st.p50_ms === "number") text += ` ${Math.round(st.p50_ms)} ms`;
  if (st.state !== "ready") text += ` ${st.state}`;
  const lines = [
    `dlm: ${st.state}${enabled ? "" : " (suggestions off)"}`,
    st.model ? `model: ${st.model}` : "",
    st.device ? `device: ${st.device}` : "",
    typeof st.p50_ms === "number" ? `latency p50 ${fmtMs(st.p50_ms)}, p95 ${fmtMs(st.p95_ms)}` : "",
    st.requests !== undefined
      ? `requests ${st.requests}, shown ${st.shown ?? 0}, accepted ${st.accepted ?? 0}`
      : "",
    st.message ?? "",
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
export interface EditPrediction {
  id: string;
  version: number;
  edits: TextEdit[];
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
  return edits.length ? { id: r.id, version: r.version, edits } : null;
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
  return { id: p.id, version: p.version, decorations, firstLine };
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

/** The item id the server put in InlineCompletionItem.command.arguments[0] (dlm.acceptCompletion). */
export function itemIdOf(command: { command?: string; arguments?: unknown[] } | undefined): string | null {
  if (!command || command.command !== "dlm.acceptCompletion" || !command.arguments?.length) return null;
  const id = command.arguments[0];
  return typeof id === "string" || typeof id === "number" ? String(id) : null;
}

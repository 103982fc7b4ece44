// Unit tests of the pure logic (node --test out/test/). No editor needed.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as path from "node:path";
import {
  DEFAULT_SETTINGS,
  SettingsError,
  INLINE_EDIT_PROPOSAL,
  MAX_INLINE_EDIT_LINES,
  acceptedItemIndex,
  acceptedLength,
  buildServerCommand,
  findExecutable,
  serverNotFoundMessage,
  initializationOptions,
  chooseEditPredictionDisplay,
  inlineEditFor,
  inlineResultSource,
  itemIdOf,
  needsRestart,
  renderEditPrediction,
  statusBarData,
  statsMessage,
  summarizeStats,
  trimTrailingBlankLines,
  validateEditPrediction,
  jumpText,
  fileJumpText,
  uriBasename,
  validateFileJump,
  versionAtLeast,
  userOnlyValue,
  USER_ONLY_SETTINGS,
  type DlmSettings,
} from "../logic.js";

const s = (over: Partial<DlmSettings>): DlmSettings => ({ ...DEFAULT_SETTINGS, ...over });

test("default settings start the server on stdio with nothing else", () => {
  assert.deepEqual(buildServerCommand(DEFAULT_SETTINGS), { command: "dlm-lsp", args: ["--stdio"] });
});

test("model and device become --model/--device; auto is the server default and is not sent", () => {
  assert.deepEqual(buildServerCommand(s({ model: " /ckpt ", device: "cuda", serverPath: "/venv/bin/dlm-lsp" })), {
    command: "/venv/bin/dlm-lsp",
    args: ["--stdio", "--model", "/ckpt", "--device", "cuda"],
  });
  assert.deepEqual(buildServerCommand(s({ device: "auto" })).args, ["--stdio"]);
});

test("a remote address switches to --remote and drops the local model options", () => {
  const cmd = buildServerCommand(
    s({ remoteAddress: "gpu:7878", remoteTokenFile: "~/.dlm-token", remoteTls: true, model: "/m", device: "cpu" }),
  );
  assert.deepEqual(cmd.args, ["--stdio", "--remote", "gpu:7878", "--token-file", "~/.dlm-token", "--tls"]);
  assert.deepEqual(buildServerCommand(s({ remoteAddress: "[::1]:9000" })).args, ["--stdio", "--remote", "[::1]:9000"]);
});

test("extra args are appended last", () => {
  assert.deepEqual(buildServerCommand(s({ serverArgs: ["--log-level", "debug"] })).args, ["--stdio", "--log-level", "debug"]);
});

test("bad settings give a SettingsError that names the setting", () => {
  assert.throws(() => buildServerCommand(s({ remoteAddress: "gpu" })), (e: Error) => e instanceof SettingsError && /dlm\.remote\.address/.test(e.message));
  assert.throws(() => buildServerCommand(s({ remoteAddress: "gpu:99999" })), /outside 1\.\.65535/);
  assert.throws(() => buildServerCommand(s({ serverPath: "  " })), /dlm\.server\.path/);
  assert.throws(() => buildServerCommand(s({ device: "tpu" as DlmSettings["device"] })), /dlm\.device/);
});

test("dlm.server.path: a path is checked as given, a name is looked up on PATH", () => {
  const exe = new Set(["/venv/bin/dlm-lsp", "/usr/local/bin/dlm-lsp", "C:\\venv\\Scripts\\dlm-lsp.exe"]);
  const isExe = (p: string) => exe.has(p);
  assert.equal(findExecutable("/venv/bin/dlm-lsp", "/usr/bin", isExe), "/venv/bin/dlm-lsp");
  assert.equal(findExecutable("/nope/bin/dlm-lsp", "/usr/local/bin", isExe), null); // never searched on PATH
  assert.equal(findExecutable("dlm-lsp", "/usr/bin::/usr/local/bin/", isExe), "/usr/local/bin/dlm-lsp");
  assert.equal(findExecutable("dlm-lsp", "/usr/bin", isExe), null);
  assert.equal(findExecutable("dlm-lsp", "C:\\Windows;C:\\venv\\Scripts", isExe, "win32"), "C:\\venv\\Scripts\\dlm-lsp.exe");
  assert.match(serverNotFoundMessage("/nope/bin/dlm-lsp"), /dlm\.server\.path is "\/nope\/bin\/dlm-lsp", which is not an executable file/);
  assert.match(serverNotFoundMessage("dlm-lsp"), /"dlm-lsp" \(dlm\.server\.path\) is not on the PATH/);
});

test("only command-line settings need a restart", () => {
  assert.equal(needsRestart(DEFAULT_SETTINGS, s({ enable: false, editPredictionDelayMs: 10 })), false);
  assert.equal(needsRestart(DEFAULT_SETTINGS, s({ model: "/m" })), true);
  assert.equal(needsRestart(s({ model: "/m" }), s({ model: "/m", remoteAddress: "h:1" })), true);
});

test("status bar shows p50 when ready and the state otherwise", () => {
  const ready = statusBarData({ state: "ready", device: "cuda", model: "dlm-small", p50_ms: 41.6, p95_ms: 90, requests: 10, shown: 4, accepted: 2 }, true);
  assert.equal(ready.text, "$(sparkle) dlm 42 ms");
  assert.match(ready.tooltip, /p50 42 ms, p95 90 ms/);
  assert.match(ready.tooltip, /requests 10, shown 4, held back -, accepted 2/);
  assert.equal(ready.error, false);
  const failed = statusBarData({ state: "failed", message: "no checkpoint at /x; pass --model" }, true);
  assert.equal(failed.text, "$(error) dlm failed");
  assert.match(failed.tooltip, /no checkpoint/);
  assert.equal(failed.error, true);
  assert.equal(statusBarData({ state: "ready", p50_ms: null }, false).text, "$(circle-slash) dlm");
  assert.match(statusBarData(null, true).tooltip, /starting/);
});

test("status bar says what the server offered and held back, and why", () => {
  const st = { state: "ready" as const, p50_ms: 120, offered: 0, held_back: 12, held_back_by: { "low confidence": 9, late: 3 } };
  assert.equal(statusBarData(st, true).text, "$(sparkle) dlm 120 ms · offered 0, held back 12 (low confidence)");
  assert.equal(statusBarData({ ...st, offered: 4, held_back: 0, held_back_by: {} }, true).text, "$(sparkle) dlm 120 ms · offered 4");
});

test("status bar says indexing N/M files until the model and the index are ready, and why an index failed", () => {
  const model = { state: "ready" as const, device: "cuda", p50_ms: 41.6, offered: 3 };
  const building = statusBarData({ ...model, ready: false, index: { state: "indexing", done: 38, total: 77, text: "indexing 38/77 files" } }, true);
  assert.equal(building.text, "$(loading~spin) dlm indexing 38/77 files");
  assert.match(building.tooltip, /^dlm: indexing 38\/77 files\n/);
  assert.doesNotMatch(building.tooltip, /ready/);
  const ready = statusBarData({ ...model, ready: true, index: { state: "ready", files: 77, text: "index: ready (77 files)" } }, true);
  assert.equal(ready.text, "$(sparkle) dlm 42 ms · offered 3");
  assert.match(ready.tooltip, /\nindex: ready \(77 files\)\n/);
  const why = "the workspace folder /w does not exist or is not a readable folder";
  const failed = statusBarData({ ...model, ready: true, index: { state: "failed", reason: why, text: `index failed: ${why}` } }, true);
  assert.equal(failed.text, "$(sparkle) dlm 42 ms · offered 3 · index failed");
  assert.match(failed.tooltip, new RegExp(`index failed: ${why}`));
  assert.equal(failed.error, false); // suggestions go on without the repository memory
  const off = statusBarData({ ...model, ready: true, index: { state: "off", text: "index off: no workspace folder to index" } }, true);
  assert.equal(off.text, "$(sparkle) dlm 42 ms · offered 3 · index off");
  const loading = statusBarData({ state: "loading", index: { state: "indexing", total: null, text: "indexing: looking for files" } }, true);
  assert.equal(loading.text, "$(loading~spin) dlm loading");
  assert.match(loading.tooltip, /\nindexing: looking for files\n/);
});

test("dlm/stats counters: held back is the sum of the gate's reasons, shown in the tooltip and the stats message", () => {
  const raw = {
    requests: 12, shown: 3, accepted: 1, partially_accepted: 2, gated_low_confidence: 4, gated_late: 1,
    gated_rewrites_recent: 0, p50_ms: 151.4, p95_ms: 230, stages_p50_ms: { denoise_ms: 140 },
  };
  const c = summarizeStats(raw);
  assert.ok(c);
  assert.equal(c.heldBack, 5);
  assert.deepEqual(c.heldBackBy, { late: 1, low_confidence: 4 });
  const bar = statusBarData({ state: "ready", p50_ms: 151.4, requests: 12, shown: 3, accepted: 1 }, true, c);
  assert.match(bar.tooltip, /shown 3, held back 5 \(late 1, low confidence 4\), accepted 1, partially accepted 2/);
  assert.equal(
    statsMessage(c),
    "dlm statistics: requests 12, shown 3, held back 5 (late 1, low confidence 4), accepted 1, partially accepted 2; " +
      "latency p50 151 ms, p95 230 ms",
  );
  const none = summarizeStats({});
  assert.ok(none);
  assert.equal(statsMessage(none), "dlm statistics: requests 0, shown 0, held back 0, accepted 0, partially accepted 0; no model run yet");
  assert.equal(summarizeStats(null), null);
  assert.equal(summarizeStats([1, 2]), null);
  assert.equal(summarizeStats({ shown: "3" })?.shown, 0); // a wrong type counts as nothing, not NaN
});

test("ghost text does not end in blank lines; one newline stays when the line goes on after it", () => {
  assert.equal(trimTrailingBlankLines("typing\n\n\n\n", ""), "typing");
  assert.equal(trimTrailingBlankLines("a\n    b\n    \n\t\n", "  "), "a\n    b");
  assert.equal(trimTrailingBlankLines("x = 1\n\n\n", "y = 2"), "x = 1\n");
  assert.equal(trimTrailingBlankLines("x = 1\r\n\r\n", "y"), "x = 1\r\n");
  assert.equal(trimTrailingBlankLines("\n\n", ""), "");
  assert.equal(trimTrailingBlankLines("keep  ", ""), "keep  "); // spaces on the last line are text
  assert.equal(trimTrailingBlankLines("if x:\n    pass", ""), "if x:\n    pass");
});

const doc = ["def f(x):", "    return x+1", "", "print(f(2))"];
const line = (n: number) => doc[n] ?? "";
const r = (l1: number, c1: number, l2: number, c2: number) => ({ start: { line: l1, character: c1 }, end: { line: l2, character: c2 } });
type Edit = { range: ReturnType<typeof r>; newText: string };
// a dlm/editPrediction result of version 7 with these edits
const prediction = (...edits: Edit[]) => ({ id: "p1", version: 7, edits });

test("edit prediction: replace, insert and delete become decorations", () => {
  const view = renderEditPrediction(
    prediction(
      { range: r(1, 11, 1, 14), newText: "x + 1" },
      { range: r(2, 0, 2, 0), newText: "\n\ndef g(y):\n    return y" },
      { range: r(3, 0, 3, 11), newText: "" },
    ),
    line,
  );
  assert.equal(view.id, "p1");
  assert.equal(view.version, 7);
  assert.equal(view.firstLine, 1);
  assert.deepEqual(
    view.decorations.map((d) => [d.kind, d.anchorLine, d.after]),
    [
      ["replace", 1, "x + 1"],
      ["insert", 2, " ⏎ … (+3 lines)"],
      ["delete", 3, ""],
    ],
  );
  assert.equal(view.decorations[1].hover, "\n\ndef g(y):\n    return y");
});

test("edit prediction: no-op edits are dropped and long text is shortened", () => {
  const v = renderEditPrediction({ id: "p", version: 1, edits: [{ range: r(1, 4, 1, 10), newText: "return" }] }, line);
  assert.equal(v.decorations.length, 0);
  const long = "y".repeat(200);
  const w = renderEditPrediction({ id: "p", version: 1, edits: [{ range: r(0, 0, 0, 0), newText: long }] }, line);
  assert.equal(w.decorations[0].after.length, 80);
  assert.ok(w.decorations[0].after.endsWith("…"));
  assert.throws(() => renderEditPrediction({ id: "p", version: 1, edits: [{ range: r(2, 5, 1, 0), newText: "" }] }, line), /ends before it starts/);
});

test("edit prediction answers are validated", () => {
  assert.equal(validateEditPrediction(null), null);
  assert.equal(validateEditPrediction({ id: "a", version: 1, edits: [] }), null);
  const ok = validateEditPrediction({ id: "a", version: 1, edits: [{ range: r(0, 0, 0, 1), newText: "z", extra: 1 }] });
  assert.deepEqual(ok, { id: "a", version: 1, edits: [{ range: r(0, 0, 0, 1), newText: "z" }] });
  assert.throws(() => validateEditPrediction({ id: 3, version: 1, edits: [] }), /expected \{id, version, edits\[\]\}/);
  assert.throws(() => validateEditPrediction({ id: "a", version: 1, edits: [{ range: r(-1, 0, 0, 0), newText: "" }] }), /not \{range, newText\}/);
});

test("partial accept length and item ids", () => {
  assert.equal(acceptedLength(100, 104, "return x"), 4);
  assert.equal(acceptedLength(100, 150, "return x"), 8);
  assert.equal(acceptedLength(100, 90, "return x"), 0);
  assert.equal(itemIdOf({ command: "dlm.acceptCompletion", arguments: ["c-12"] }), "c-12");
  assert.equal(itemIdOf({ command: "other", arguments: ["c-12"] }), null);
  assert.equal(itemIdOf(undefined), null);
});

test("a partial accept is counted for the item the user cycled to", () => {
  const items = ["gadget(registry)", "widget(registry)", "widget(registry, strict=True)"];
  assert.equal(acceptedItemIndex(items, "gadget("), 0);
  assert.equal(acceptedItemIndex(items, "widget("), 1); // the first of the items it could be
  assert.equal(acceptedItemIndex(items, "widget(registry, "), 2);
  assert.equal(acceptedItemIndex(items, ""), 0);
  assert.equal(acceptedItemIndex(items, "sprocket"), 0); // typed by hand: the answer
});

test("inline edits are used only where VS Code has them and allows the proposal", () => {
  const caps = { version: "1.101.2", enabledApiProposals: [INLINE_EDIT_PROPOSAL], hasDisplayLocationKind: true };
  assert.equal(chooseEditPredictionDisplay("auto", caps).mode, "inlineEdit");
  // stable VS Code without --enable-proposed-api empties the declared list
  const notAllowed = chooseEditPredictionDisplay("auto", { ...caps, enabledApiProposals: [] });
  assert.equal(notAllowed.mode, "decorations");
  assert.match(notAllowed.why, /--enable-proposed-api dlm-lsp\.dlm-lsp/);
  assert.equal(chooseEditPredictionDisplay("auto", { ...caps, enabledApiProposals: undefined }).mode, "decorations");
  const old = chooseEditPredictionDisplay("auto", { ...caps, version: "1.91.0" });
  assert.equal(old.mode, "decorations");
  assert.match(old.why, /older than/);
  assert.equal(chooseEditPredictionDisplay("auto", { ...caps, version: "1.102.0-insider" }).mode, "inlineEdit");
  const refused = chooseEditPredictionDisplay("auto", { ...caps, proposalProbe: false });
  assert.equal(refused.mode, "decorations");
  assert.match(refused.why, /refused/);
  assert.equal(chooseEditPredictionDisplay("auto", { ...caps, proposalProbe: true }).mode, "inlineEdit");
  assert.equal(chooseEditPredictionDisplay("decorations", caps).mode, "decorations");
  assert.equal(chooseEditPredictionDisplay("inlineEdit", { ...caps, version: "1.91.0", enabledApiProposals: [] }).mode, "inlineEdit");
  assert.equal(DEFAULT_SETTINGS.editPredictionDisplay, "auto");
});

test("version comparison", () => {
  assert.equal(versionAtLeast("1.99.0", "1.99.0"), true);
  assert.equal(versionAtLeast("1.100.1", "1.99.0"), true);
  assert.equal(versionAtLeast("1.98.9", "1.99.0"), false);
  assert.equal(versionAtLeast("2.0", "1.99.0"), true);
  assert.equal(versionAtLeast("nightly", "1.99.0"), false);
});

test("inline edit: the edits merged into one replacement of the covered text", () => {
  const e = inlineEditFor(
    prediction(
      { range: r(3, 0, 3, 11), newText: "" },
      { range: r(1, 11, 1, 14), newText: "x + 1" },
    ),
    { line: 1, character: 0 },
    line,
  );
  assert.ok(e);
  assert.equal(e.id, "p1");
  assert.equal(e.version, 7);
  assert.deepEqual(e.range, r(1, 11, 3, 11));
  assert.equal(e.insertText, "x + 1\n\n"); // "x+1\n\nprint(f(2))" with both edits applied
  assert.equal(e.displayLocation, undefined); // at the cursor: VS Code draws it in place
  // applying the merged edit gives the same document as applying the edits one by one
  const apply = (lines: string[], rg: ReturnType<typeof r>, text: string) => {
    const full = lines.join("\n");
    const off = (p: { line: number; character: number }) =>
      lines.slice(0, p.line).reduce((n, l) => n + l.length + 1, 0) + p.character;
    return full.slice(0, off(rg.start)) + text + full.slice(off(rg.end));
  };
  assert.equal(apply(doc, e.range, e.insertText), "def f(x):\n    return x + 1\n\n");
});

test("inline edit: far from the cursor it gets a display location; no-op, overlapping, huge: none", () => {
  const far = inlineEditFor({ id: "p", version: 1, edits: [{ range: r(3, 0, 3, 5), newText: "pprint" }] }, { line: 0, character: 0 }, line);
  assert.ok(far?.displayLocation);
  assert.deepEqual(far.displayLocation.range, r(3, 0, 3, 5));
  assert.equal(far.displayLocation.kind, "code");
  assert.match(far.displayLocation.label, /line 4/);
  assert.equal(inlineEditFor({ id: "p", version: 1, edits: [{ range: r(1, 4, 1, 10), newText: "return" }] }, { line: 1, character: 0 }, line), null);
  const overlap = [
    { range: r(1, 0, 1, 8), newText: "a" },
    { range: r(1, 4, 1, 10), newText: "b" },
  ];
  assert.equal(inlineEditFor({ id: "p", version: 1, edits: overlap }, { line: 1, character: 0 }, line), null);
  const big = [
    { range: r(0, 0, 0, 1), newText: "D" },
    { range: r(MAX_INLINE_EDIT_LINES + 5, 0, MAX_INLINE_EDIT_LINES + 5, 0), newText: "x" },
  ];
  assert.equal(inlineEditFor({ id: "p", version: 1, edits: big }, { line: 0, character: 0 }, line), null);
});

test("inline result: a completion at the cursor wins unless the request is our trigger for the edit", () => {
  assert.equal(inlineResultSource({ editPending: true, ourTrigger: true, completionCount: null }), "inlineEdit");
  assert.equal(inlineResultSource({ editPending: true, ourTrigger: false, completionCount: 1 }), "completions");
  assert.equal(inlineResultSource({ editPending: true, ourTrigger: false, completionCount: 0 }), "inlineEdit");
  assert.equal(inlineResultSource({ editPending: false, ourTrigger: false, completionCount: 2 }), "completions");
  assert.equal(inlineResultSource({ editPending: false, ourTrigger: true, completionCount: 0 }), "none");
});

test("settings become the server's initializationOptions; unset numbers keep the server's defaults", () => {
  assert.deepEqual(initializationOptions(DEFAULT_SETTINGS), { editPredictions: true });
  const s = { ...DEFAULT_SETTINGS, editPredictions: true, minConfidence: 1.7, deadlineMs: 400 };
  assert.deepEqual(initializationOptions(s), { editPredictions: true, minConfidence: 1, deadlineMs: 400 });
  assert.deepEqual(initializationOptions({ ...DEFAULT_SETTINGS, deadlineMs: -5 }), { editPredictions: true });
  assert.equal(needsRestart(DEFAULT_SETTINGS, { ...DEFAULT_SETTINGS, minConfidence: 0.3 }), true);
  assert.equal(needsRestart(DEFAULT_SETTINGS, { ...DEFAULT_SETTINGS }), false);
});

test("the user's engine setting goes to the server marked user-scoped; none sends no engine", () => {
  assert.equal("engine" in initializationOptions(DEFAULT_SETTINGS), false);
  const engine = { kind: "mercury-edit", apiKeyEnv: "INCEPTION_API_KEY", scope: "workspace" };
  assert.deepEqual(initializationOptions({ ...DEFAULT_SETTINGS, engine }).engine, {
    kind: "mercury-edit", apiKeyEnv: "INCEPTION_API_KEY", scope: "user",
  });
  assert.equal(needsRestart(DEFAULT_SETTINGS, { ...DEFAULT_SETTINGS, engine }), true);
});

test("edit prediction: a far edit's jump hint is kept, shown at the cursor and labels the inline edit", () => {
  const raw = {
    id: "j", version: 2, edits: [{ range: r(3, 6, 3, 7), newText: "g" }],
    jump: { position: { line: 3, character: 6 }, lines: 3, label: "rename f → g" },
  };
  const p = validateEditPrediction(raw);
  assert.ok(p?.jump);
  assert.equal(jumpText(p.jump), "⇥ ↓ line 4: rename f → g");
  assert.deepEqual(renderEditPrediction(p, line).jump, p.jump);
  const e = inlineEditFor(p, { line: 0, character: 0 }, line);
  assert.equal(e?.displayLocation?.label, "⇥ ↓ line 4: rename f → g");
  // a malformed hint is dropped, the edit kept
  const bad = validateEditPrediction({ ...raw, jump: { position: { line: -1 }, lines: "x", label: 3 } });
  assert.ok(bad && bad.jump === undefined && bad.edits.length === 1);
});

test("edit prediction: a jump to another file comes without edits and is kept; a malformed one shows nothing", () => {
  const jump = {
    uri: "file:///abs/path/pkg/b.py", path: "pkg/b.py",
    position: { line: 12, character: 4 }, label: "rename count → tally",
  };
  const raw = {
    id: "7", version: 3, edits: [], confidence: 0.31, rewritesRecent: false, source: "editMemory",
    label: "rename count → tally", jump,
  };
  const p = validateEditPrediction(raw);
  assert.ok(p);
  assert.deepEqual(p.edits, []);
  assert.equal(p.jump, undefined); // not a same-file hint: nothing here to apply
  assert.deepEqual(p.fileJump, jump);
  assert.equal(fileJumpText(p.fileJump), "⇥ pkg/b.py:13: rename count → tally");
  // no decorations, the hint carried to the view; never an inline edit of this document
  const view = renderEditPrediction(p, line);
  assert.deepEqual(view.decorations, []);
  assert.deepEqual(view.fileJump, jump);
  assert.equal(inlineEditFor(p, { line: 0, character: 0 }, line), null);
  // `path` is optional: the uri's file name, percent-decoded
  const noPath = validateEditPrediction({ ...raw, jump: { ...jump, path: undefined, uri: "file:///w/my%20lib/b%C3%A9.py" } });
  assert.equal(noPath?.fileJump?.path, "bé.py");
  assert.equal(fileJumpText(noPath!.fileJump!), "⇥ bé.py:13: rename count → tally");
  assert.equal(validateFileJump({ ...jump, path: "  " })?.path, "b.py");
  assert.equal(uriBasename("file:///a/b/c.py?x=1#L2"), "c.py");
  assert.equal(uriBasename("file:///a/b/100%.py"), "100%.py");
  // malformed: no uri, a uri that is not one, a bad position, no label, not an object -> nothing shown
  for (const bad of [
    { ...jump, uri: undefined },
    { ...jump, uri: 42 },
    { ...jump, uri: "pkg/b.py" },
    { ...jump, position: { line: -1, character: 0 } },
    { ...jump, position: { line: 1.5, character: 0 } },
    { ...jump, position: undefined },
    { ...jump, label: undefined },
    { ...jump, label: ["x"] },
    "file:///abs/path/pkg/b.py",
    [jump],
    null,
  ]) {
    assert.equal(validateEditPrediction({ ...raw, jump: bad }), null, JSON.stringify(bad));
  }
  assert.equal(validateEditPrediction({ id: "7", version: 3, edits: [] }), null);
  // a same-file hint without edits is still nothing to show (old shape: edits carry the hint)
  const sameFile = { position: { line: 3, character: 6 }, lines: 3, label: "rename f → g" };
  assert.equal(validateEditPrediction({ ...raw, jump: sameFile }), null);
});

test("edit prediction: the same-file jump shape is unchanged by the other-file hint", () => {
  const raw = {
    id: "j", version: 2, edits: [{ range: r(3, 6, 3, 7), newText: "g" }],
    jump: { position: { line: 3, character: 6 }, lines: -3, label: "rename f → g" },
  };
  const p = validateEditPrediction(raw);
  assert.deepEqual(p, { id: "j", version: 2, edits: raw.edits, jump: raw.jump });
  assert.equal(jumpText(raw.jump), "⇥ ↑ line 4: rename f → g");
  assert.equal(renderEditPrediction(validateEditPrediction(raw)!, line).fileJump, undefined);
  // a uri next to edits does not turn it into a jump to another file: the edits are applied here
  const withUri = validateEditPrediction({ ...raw, jump: { ...raw.jump, uri: "file:///x/b.py", lines: 5 } });
  assert.deepEqual(withUri?.jump, { position: raw.jump.position, lines: 5, label: "rename f → g" });
  assert.equal(withUri?.fileJump, undefined);
});

test("a workspace cannot set the settings that choose what runs, where code goes or which credentials are read", () => {
  // package.json declares each of them machine-scoped, so VS Code offers them in user settings only
  const pkg = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "..", "package.json"), "utf8"));
  const props = pkg.contributes.configuration.properties ?? pkg.contributes.configuration[0].properties;
  for (const key of USER_ONLY_SETTINGS) {
    assert.equal(props[`dlm.${key}`]?.scope, "machine", `dlm.${key} must be machine-scoped`);
  }
  for (const key of ["server.path", "server.args", "model", "remote.address", "remote.tokenFile", "remote.tls"]) {
    assert.ok((USER_ONLY_SETTINGS as readonly string[]).includes(key), key);
  }
  // and the value read ignores a workspace's and a folder's value
  assert.equal(userOnlyValue({ defaultValue: "dlm-lsp", workspaceValue: "/tmp/evil", workspaceFolderValue: "/x" }, "d"), "dlm-lsp");
  assert.equal(userOnlyValue({ defaultValue: "dlm-lsp", globalValue: "/home/me/.venv/bin/dlm-lsp", workspaceValue: "/tmp/evil" }, "d"),
    "/home/me/.venv/bin/dlm-lsp");
  assert.equal(userOnlyValue<boolean>({ defaultValue: false, workspaceValue: true }, false), false);
  assert.equal(userOnlyValue<string>(undefined, "fallback"), "fallback");
});

// Drives a real VS Code (code-server) in headless Chromium as a user would, for
// tests/editors/test_vscode_e2e.py. Everything it checks is read from the page: the
// status bar item, ghost text, the editor's lines, notifications, the inline-edit widget.
//
// node vscode_e2e_driver.mjs CONFIG.json
//   CONFIG: {url, playwrightCore, chromium, chromiumProfile, shots, report, settingsPath,
//            settings, file, ghost: {type: [words...], expected: string|null}, wrongServerPath}
// Writes CONFIG.report: {steps: [{name, ok, detail, screenshot}], ...}; exit 0 when every step passed.
// A step that fails is recorded with its error and a screenshot; the steps after it still run
// where they do not depend on it, so one run shows everything that is broken.
import { createRequire } from "node:module";
import * as fs from "node:fs";
import * as path from "node:path";

const cfg = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const require = createRequire(path.join(cfg.playwrightCore, "package.json"));
const { chromium } = require("playwright-core");

// Chromium as root in a container, with no network: no sandbox, no GPU, and none of the
// background fetches (they would flood the log with refused connections).
const CHROMIUM_ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--disable-dev-shm-usage",
];

const STATUS = '[id^="dlm-lsp.dlm-lsp"]'; // our status bar item (VS Code prefixes the extension id)
const EDITOR = ".editor-instance .monaco-editor"; // the text editor of the active editor group
const GHOST = `${EDITOR} .ghost-text-decoration, ${EDITOR} .ghost-text-decoration-preview, ${EDITOR} .ghost-text`;

const report = { steps: [], warnings: [], console_errors: [] };
let shotNo = 0;
let page;

function log(...a) {
  console.log(`[${new Date().toISOString().slice(11, 23)}]`, ...a);
}

async function shot(name) {
  shotNo += 1;
  const file = path.join(cfg.shots, `${String(shotNo).padStart(2, "0")}-${name}.png`);
  try {
    await page.screenshot({ path: file });
  } catch (e) {
    log(`screenshot ${name} failed: ${e}`);
  }
  return file;
}

async function step(name, fn) {
  if (cfg.onlySteps && !cfg.onlySteps.includes(name) && name !== "workbench-and-status-ready") return true;
  const t0 = Date.now();
  log(`step ${name}`);
  const rec = { name, ok: false, detail: {} };
  report.steps.push(rec);
  try {
    await fn(rec.detail);
    rec.ok = true;
  } catch (e) {
    rec.error = String(e && e.stack ? e.stack : e).slice(0, 4000);
    log(`step ${name} FAILED: ${rec.error}`);
  }
  rec.screenshot = await shot(name + (rec.ok ? "" : "-FAILED"));
  rec.seconds = (Date.now() - t0) / 1000;
  fs.writeFileSync(cfg.report, JSON.stringify(report, null, 2));
  return rec.ok;
}

/** Something a user would notice that the test does not fail on (VS Code's own behaviour). */
function warn(msg) {
  log(`warning: ${msg}`);
  report.warnings.push(msg);
}

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

async function until(what, fn, timeoutMs, everyMs = 200) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await fn();
    if (last) return last;
    if (Date.now() > end) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await page.waitForTimeout(everyMs);
  }
}

// ---- reading the page -------------------------------------------------------

/** The status bar item's text and its accessible label (VS Code puts the tooltip there). */
async function statusItem() {
  const el = await page.$(STATUS);
  if (!el) return null;
  return el.evaluate((e) => ({ text: e.textContent ?? "", label: e.getAttribute("aria-label") ?? "" }));
}

/** The lines of the active editor as the user sees them, without ghost text. */
async function editorLines() {
  return page.$eval(`${EDITOR} .view-lines`, (root) => {
    const lines = [...root.querySelectorAll(":scope > .view-line")].map((l) => {
      const c = l.cloneNode(true);
      for (const g of c.querySelectorAll('[class*="ghost-text"], [class*="inline-edit"]')) g.remove();
      return { top: parseFloat(l.style.top || "0"), text: (c.textContent ?? "").replace(/\u00a0/g, " ") };
    });
    lines.sort((a, b) => a.top - b.top);
    return lines.map((l) => l.text);
  });
}

/** The ghost text shown in the active editor: the part on the cursor line, then the lines below. */
async function ghostText() {
  return page.evaluate((editorSel) => {
    const ed = document.querySelector(editorSel);
    if (!ed) return "";
    const clean = (s) => (s ?? "").replace(/\u00a0/g, " ");
    // On the cursor line: spans inside .view-line; further lines: a view zone of .ghost-text lines.
    const inline = [...ed.querySelectorAll(".view-lines .ghost-text-decoration, .view-lines .ghost-text-decoration-preview")]
      .map((e) => clean(e.textContent))
      .join("");
    const zoneLines = [...ed.querySelectorAll(".view-zones .ghost-text .view-line, .view-zones .suggest-preview-text .view-line")]
      .map((l) => ({ top: parseFloat(l.style.top || "0"), text: clean(l.textContent) }))
      .sort((a, b) => a.top - b.top)
      .map((l) => l.text);
    if (!inline && !zoneLines.length) return "";
    return [inline, ...zoneLines].join("\n");
  }, EDITOR);
}

async function cursorPosition() {
  const t = await page.$eval(".statusbar-item[id='status.editor.selection']", (e) => e.textContent ?? "").catch(() => "");
  const m = /Ln (\d+), Col (\d+)/.exec(t);
  return m ? { line: Number(m[1]) - 1, col: Number(m[2]) - 1 } : null;
}

/** Texts of the notification toasts on screen (message and source). */
async function notifications() {
  return page.$$eval(".notifications-toasts .notification-list-item-message", (els) =>
    els.map((e) => (e.textContent ?? "").replace(/\u00a0/g, " ")),
  );
}

async function clearNotifications() {
  await runCommand("Notifications: Clear All Notifications").catch(() => {});
}

// ---- acting as a user -------------------------------------------------------

async function runCommand(title) {
  await page.keyboard.press("Escape");
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: 10000 });
  await input.fill(`>${title}`);
  // The row of the command itself, not a fuzzy neighbour ("..., recently used" and keys may follow).
  const index = await until(
    `the command palette to list "${title}"`,
    async () => {
      const rows = await page.$$eval(".quick-input-widget .monaco-list-row", (els) =>
        els.map((e) => e.getAttribute("aria-label") ?? e.textContent ?? ""),
      );
      const i = rows.findIndex((r) => r === title || r.startsWith(title + ","));
      return i >= 0 ? i + 1 : 0;
    },
    10000,
  );
  for (let i = 1; i < index; i++) await page.keyboard.press("ArrowDown");
  await page.keyboard.press("Enter");
}

async function openFile(relPath) {
  await page.keyboard.press("Escape");
  await page.keyboard.press("Control+P");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible", timeout: 10000 });
  await input.fill(relPath);
  await until(`quick open to list ${relPath}`, async () => (await page.$$(".quick-input-widget .monaco-list-row")).length > 0, 10000);
  await page.keyboard.press("Enter");
  await page.waitForSelector(`${EDITOR} .view-lines .view-line`, { timeout: 20000 });
  await until(`the tab of ${relPath}`, async () => (await page.$$eval(".tab.active", (e) => e.map((t) => t.textContent ?? ""))).some((t) => t.includes(path.basename(relPath))), 10000);
  await page.click(`${EDITOR} .view-lines`);
}

/** Types like a user (one key at a time, a short gap between keys). */
async function typeText(text) {
  await page.keyboard.type(text, { delay: 40 });
}

/**
 * Types `words` one at a time and pauses after each, until ghost text shows (or `expected`
 * is shown when given). Returns {typedUpTo, ghost}.
 */
async function typeUntilGhost(words, expected, pauseMs) {
  let typed = "";
  for (const w of words) {
    await typeText(w);
    typed += w;
    const end = Date.now() + pauseMs;
    while (Date.now() < end) {
      await page.waitForTimeout(150);
      const g = await ghostText();
      if (g && (expected === null || g === expected)) {
        await page.waitForTimeout(300); // let a multi-line ghost finish rendering
        const again = await ghostText();
        if (again === g) return { typed, ghost: g };
      }
    }
  }
  return { typed, ghost: "" };
}

/**
 * Rests the cursor on lines typed long ago (no recent-typing bar) until an edit prediction of
 * `kind` shows, presses Tab, and checks that the document changed as shown and that the server
 * counted the accept (`acceptedBefore`: its count before).
 */
async function showAndApplyEditPrediction(d, kind, acceptedBefore, rename) {
  await openFile(cfg.file);
  let shown = null;
  if (rename) {
    // A user's edit the edit memory can repeat: rename one use, then rest the cursor there.
    await renameAt(rename);
    d.renamed = rename;
    shown = await until(`an edit prediction (${kind}) after renaming ${rename.old}`, editPredictionOnScreen,
      cfg.editPrediction.waitMs ?? 15000).catch(() => null);
  }
  const before = await editorLines();
  for (const line of shown ? [] : cfg.editPrediction.lines) {
    await page.keyboard.press("Escape");
    await page.keyboard.press("Control+Home");
    for (let i = 0; i < line; i++) await page.keyboard.press("ArrowDown");
    await page.keyboard.press("End");
    shown = await until(`an edit prediction (${kind})`, editPredictionOnScreen, cfg.editPrediction.waitMs ?? 15000).catch(() => null);
    if (shown) break;
  }
  d.shown = shown;
  check(shown, "no edit prediction was shown at any of the tried lines");
  await page.waitForTimeout(500); // let it finish drawing, then read it again
  shown = (await editPredictionOnScreen()) ?? shown;
  d.shown = shown;
  check(shown.kind === kind, `the edit prediction shows as ${shown.kind}, expected ${kind}`);
  d.ghostToo = await ghostText();
  await shot(`edit-prediction-shown-${kind}`);
  // Tab applies; an inline edit away from the cursor may take two (the first jumps to it, as in Copilot).
  let after = before;
  for (let tab = 1; tab <= 2; tab++) {
    await page.keyboard.press("Tab");
    // Read before the next prediction can come (it is asked for 300 ms after the cursor moves).
    await page.waitForTimeout(150);
    d.shownAfterTab = await editPredictionOnScreen();
    await page.waitForTimeout(650);
    after = await editorLines();
    d.tabs = tab;
    if (after.join("\n") !== before.join("\n")) break;
    await shot(`edit-prediction-after-tab-${tab}`);
  }
  d.diff = insertedText(before, after);
  check(d.diff.inserted !== "" || d.diff.removed !== "", "Tab did not change the document");
  const flat = (t) => t.replace(/\s+/g, " ").trim();
  if (kind === "decoration") {
    // One "→ new text" per edit (its first line, shortened): each must now be in the document.
    const fragments = shown.text.split("\n").map((f) => flat(f.replace(/^→ /, "").replace(/ ⏎ … \(\+\d+ lines?\)$/, "").replace(/…$/, "")));
    d.fragments = fragments;
    for (const f of fragments) check(!f || flat(after.join("\n")).includes(f), `the decoration showed ${JSON.stringify(f)}, which Tab did not put in the document`);
  } else {
    // VS Code's inline edit shows the new text (long lines shortened): compare its start.
    const insertedStart = flat(d.diff.inserted.split("\n").find((l) => l.trim()) ?? "").slice(0, 30);
    check(!insertedStart || flat(shown.text).includes(insertedStart),
      `Tab inserted ${JSON.stringify(d.diff.inserted)}, which the edit prediction on screen did not show (${JSON.stringify(shown.text)})`);
  }
  check(!d.shownAfterTab || d.shownAfterTab.text !== shown.text, "the edit prediction is still shown after it was applied");
  d.stats = await serverStats();
  check(d.stats.accepted >= acceptedBefore + 1, `the server counted no accept of the edit prediction: ${d.stats.text}`);
}

/** Selects `rename.old` on line `rename.line` (0-based) with the keyboard and types `rename.new`. */
async function renameAt(rename) {
  const lines = await editorLines();
  const text = lines[rename.line] ?? "";
  const col = text.indexOf(rename.old);
  check(col >= 0, `line ${rename.line} does not hold ${JSON.stringify(rename.old)}: ${JSON.stringify(text)}`);
  await page.keyboard.press("Escape");
  await page.keyboard.press("Control+Home");
  for (let i = 0; i < rename.line; i++) await page.keyboard.press("ArrowDown");
  await page.keyboard.press("End");
  await page.keyboard.press("Home"); // the first non-blank character
  const indent = text.length - text.trimStart().length;
  for (let i = indent; i < col; i++) await page.keyboard.press("ArrowRight");
  for (let i = 0; i < rename.old.length; i++) await page.keyboard.press("Shift+ArrowRight");
  await typeText(rename.new);
}

/**
 * The edit prediction on screen, or null: VS Code's inline edit (its gutter indicator shows the
 * Tab key) or our decorations (struck-out text, "→ new text" after the line). `text`: what it shows.
 */
// A step that leaves a half-typed line deletes it (VS Code's Delete Line), so the next step's
// file holds only whole lines: the repository memory counts the current file, and a partial
// "    return math.pi * radius" beside the whole line would split its proposals (a real user's
// file with both is ambiguous too, and the gate then rightly holds the suggestion back).
async function deleteTypedLine() {
  await page.keyboard.press("Control+Shift+K");
  await page.waitForTimeout(300);
}

async function editPredictionOnScreen() {
  return page.evaluate((sel) => {
    const ed = document.querySelector(sel);
    if (!ed) return null;
    const visible = (e) => {
      const r = e.getBoundingClientRect();
      const st = getComputedStyle(e);
      return r.width > 0 && r.height > 0 && st.visibility !== "hidden" && st.display !== "none";
    };
    const after = [...ed.querySelectorAll(".view-lines .view-line span")]
      .map((s) => getComputedStyle(s, "::after").content)
      .filter((c) => c && c.startsWith('"→'))
      .map((c) => JSON.parse(c));
    if (after.length) return { kind: "decoration", text: after.join("\n") };
    const tabKey = [...ed.querySelectorAll(".inline-edits-view-gutter-indicator .codicon-keyboard-tab")].filter(visible);
    if (!tabKey.length) return null;
    // innerText: only what is rendered (the widgets themselves are zero-size absolute boxes).
    const text = [...ed.querySelectorAll('[class*="inline-edits"]')]
      .map((e) => e.innerText ?? "")
      .join("\n")
      .replace(/\u00a0/g, " ");
    return text.trim() ? { kind: "inlineEdit", text } : null; // drawn once its text is on screen
  }, EDITOR);
}

/** The "jump to another file" hint on screen (a decoration "⇥ path:line: label"), or null. */
async function jumpHintOnScreen() {
  return page.evaluate((sel) => {
    const ed = document.querySelector(sel);
    if (!ed) return null;
    const hints = [...ed.querySelectorAll(".view-lines .view-line span")]
      .map((s) => getComputedStyle(s, "::after").content)
      .filter((c) => c && c.startsWith('"⇥'))
      .map((c) => JSON.parse(c));
    return hints.length ? hints.join("\n") : null;
  }, EDITOR);
}

async function activeTab() {
  return (await page.$$eval(".tab.active", (e) => e.map((t) => (t.textContent ?? "").trim())))[0] ?? "";
}

function insertedText(before, after) {
  // The document as one string; what was inserted is the middle that differs.
  const a = before.join("\n");
  const b = after.join("\n");
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  let j = 0;
  while (j < a.length - i && j < b.length - i && a[a.length - 1 - j] === b[b.length - 1 - j]) j++;
  return { removed: a.slice(i, a.length - j), inserted: b.slice(i, b.length - j), at: i };
}

/** Changes a user setting in the Settings editor, as a user does: search, then type or tick. */
async function setSetting(key, value, { isDefault = false } = {}) {
  await runCommand("Preferences: Open User Settings");
  const search = page.locator(".settings-editor .settings-header .suggest-input-container .monaco-editor");
  await search.waitFor({ state: "visible", timeout: 15000 });
  await search.click();
  await page.keyboard.press("Control+A");
  await page.keyboard.type(key, { delay: 20 });
  const row = page.locator(`.settings-editor .setting-item-contents[data-key="${key}"]`);
  await row.waitFor({ state: "visible", timeout: 15000 });
  const select = row.locator("select");
  if (typeof value === "string" && (await select.count())) {
    await select.selectOption(value); // an enum: VS Code's select box takes the change event
  } else if (typeof value === "boolean") {
    const box = row.locator(".setting-value-checkbox");
    const checked = (await box.getAttribute("aria-checked")) === "true";
    if (checked !== value) await box.click();
  } else {
    const input = row.locator("input.setting-control-focus-target");
    await input.click();
    await page.keyboard.press("Control+A");
    await page.keyboard.type(String(value), { delay: 10 });
    await page.keyboard.press("Tab");
  }
  // The Settings editor writes settings.json after a short debounce.
  await until(
    `settings.json to hold ${key} = ${JSON.stringify(value)}`,
    async () => {
      try {
        const text = fs.readFileSync(cfg.settingsPath, "utf8");
        const stored = JSON.parse(text)[key];
        // back to its default, VS Code may drop the key from settings.json instead of writing the value
        return JSON.stringify(stored) === JSON.stringify(value) || (isDefault && stored === undefined);
      } catch {
        return false;
      }
    },
    10000,
  );
  await shot(`setting-${key}`);
  // The Settings editor stays open in its tab; the next step brings its file back to the front.
}

async function statusReady(timeoutMs) {
  return until(
    'the dlm status bar item to say "ready"',
    async () => {
      const s = await statusItem();
      return s && /dlm: ready/.test(s.label) ? s : null;
    },
    timeoutMs,
  );
}

/** Waits for the status to leave "ready" (the server stopped) and to come back to it. */
async function serverRestarted(d) {
  d.during = await until(
    "the status to leave ready (the server restarting)",
    async () => {
      const s = await statusItem();
      return s && !/dlm: ready/.test(s.label) ? s : null;
    },
    20000,
    50,
  );
  d.ready = await statusReady(120000);
}

/** The server's counters as `dlm: Show Statistics` reports them (a notification). */
async function serverStats() {
  await clearNotifications();
  await runCommand("dlm: Show Statistics");
  const text = await until(
    "the dlm statistics notification",
    async () => (await notifications()).find((t) => /dlm statistics/.test(t)),
    15000,
  );
  const num = (k) => {
    const m = new RegExp(`${k} (\\d+)`).exec(text);
    return m ? Number(m[1]) : NaN;
  };
  return { text, accepted: num("accepted"), partially_accepted: num("partially accepted"), shown: num("shown"), held_back: num("held back") };
}

// ---- the run ------------------------------------------------------------------

async function main() {
  fs.mkdirSync(cfg.shots, { recursive: true });
  const context = await chromium.launchPersistentContext(cfg.chromiumProfile, {
    executablePath: cfg.chromium,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1400, height: 900 },
    env: { ...process.env, ...(cfg.chromiumEnv ?? {}) },
  });
  page = context.pages()[0] ?? (await context.newPage());
  const consoleLog = fs.createWriteStream(path.join(cfg.shots, "browser-console.log"));
  page.on("console", (m) => {
    consoleLog.write(`[${new Date().toISOString().slice(11, 23)}] ${m.type()}: ${m.text().slice(0, 4000)}\n`);
    if (m.type() === "error" && report.console_errors.length < 200) report.console_errors.push(m.text().slice(0, 500));
  });
  try {
    await run();
  } finally {
    fs.writeFileSync(cfg.report, JSON.stringify(report, null, 2));
    await context.close();
  }
}

async function run() {
  const opened = await step("workbench-and-status-ready", async (d) => {
    await page.goto(cfg.url);
    await page.waitForSelector(".monaco-workbench", { timeout: 60000 });
    await page.waitForSelector(STATUS, { timeout: 60000 });
    d.first = await statusItem();
    d.ready = await statusReady(120000);
    // The counters come from dlm/stats, asked for once the server is ready.
    d.counts = await until(
      "the status tooltip to say shown / held back",
      async () => {
        const s = await statusItem();
        return s && /shown \d+, held back \d+/.test(s.label) ? s : null;
      },
      10000,
    );
    await page.hover(STATUS);
    await page.waitForSelector(".monaco-hover, .workbench-hover", { timeout: 5000 }).catch(() => {});
    await shot("status-tooltip");
    await page.mouse.move(700, 400);
  });
  if (!opened) return;

  let ghost = null;
  await step("ghost-text-at-a-pause", async (d) => {
    await openFile(cfg.file);
    await page.keyboard.press("Control+End");
    await page.keyboard.press("Enter");
    await page.keyboard.press("Enter");
    const before = await editorLines();
    const r = await typeUntilGhost(cfg.ghost.type, cfg.ghost.expected ?? null, cfg.ghost.pauseMs ?? 6000);
    d.typed = r.typed;
    d.ghost = r.ghost;
    d.status = await statusItem();
    check(r.ghost, `no ghost text appeared after typing ${JSON.stringify(r.typed)} with pauses`);
    if (cfg.ghost.expected != null) check(r.ghost === cfg.ghost.expected, `ghost text ${JSON.stringify(r.ghost)}, expected ${JSON.stringify(cfg.ghost.expected)}`);
    ghost = { text: r.ghost, before: await editorLines(), typedBefore: before };
  });

  let statsBefore = null;
  await step("tab-accepts-and-the-server-counts-it", async (d) => {
    check(ghost, "no ghost text to accept (previous step)");
    const before = await editorLines();
    await page.keyboard.press("Tab");
    await page.waitForTimeout(500);
    await shot("tab-accepted");
    const after = await editorLines();
    const diff = insertedText(before, after);
    d.diff = diff;
    check(diff.removed === "", `Tab removed text: ${JSON.stringify(diff.removed)}`);
    check(diff.inserted === ghost.text, `Tab inserted ${JSON.stringify(diff.inserted)}, the ghost text was ${JSON.stringify(ghost.text)}`);
    check((await ghostText()) === "", "ghost text still shown after Tab");
    const stats = await serverStats();
    d.stats = stats;
    check(stats.accepted >= 1, `the server counted no accept: ${stats.text}`);
    statsBefore = stats;
  });

  // A second suggestion, on a fresh line, for the partial accepts.
  const partial = async (name, key, kind) =>
    step(name, async (d) => {
      await page.keyboard.press("Escape");
      await page.keyboard.press("End");
      await page.keyboard.press("Enter");
      await page.keyboard.press("Enter");
      // VS Code indents the new line like the one above (a line the step before typed): the
      // typed text brings its own indentation, so the line is the same as in the first step.
      // (The status bar's "Ln, Col" follows the cursor with a delay: read it after each key.)
      for (let i = 0; i < 8; i++) {
        await page.waitForTimeout(200);
        if (((await cursorPosition())?.col ?? 0) === 0) break;
        await page.keyboard.press("Backspace");
      }
      const r = await typeUntilGhost(cfg.ghost.type, null, cfg.ghost.pauseMs ?? 6000);
      d.typed = r.typed;
      d.ghost = r.ghost;
      check(r.ghost, `no ghost text appeared after typing ${JSON.stringify(r.typed)}`);
      const before = await editorLines();
      await shot(`${name}-ghost`);
      await page.keyboard.press(key);
      await page.waitForTimeout(500);
      await shot(`${name}-accepted`);
      const after = await editorLines();
      const diff = insertedText(before, after);
      d.diff = diff;
      d.ghostAfter = await ghostText();
      check(diff.removed === "", `${key} removed text: ${JSON.stringify(diff.removed)}`);
      check(diff.inserted.length > 0, `${key} inserted nothing (ghost ${JSON.stringify(r.ghost)})`);
      check(r.ghost.startsWith(diff.inserted), `${key} inserted ${JSON.stringify(diff.inserted)}, not a start of the ghost text ${JSON.stringify(r.ghost)}`);
      const rest = r.ghost.slice(diff.inserted.length);
      if (kind === "word") {
        // VS Code's word: leading whitespace plus one run of word or non-word characters.
        check(/^\s*(\w+|[^\w\s]+)\s*$/.test(diff.inserted) || diff.inserted === r.ghost, `${key} inserted more than a word: ${JSON.stringify(diff.inserted)}`);
      } else {
        const firstLine = r.ghost.split("\n")[0];
        check(diff.inserted === firstLine || diff.inserted === firstLine + "\n" || (firstLine === "" && diff.inserted === "\n"),
          `${key} inserted ${JSON.stringify(diff.inserted)}, not the first line of ${JSON.stringify(r.ghost)}`);
      }
      if (rest.trim()) check(d.ghostAfter && rest.startsWith(d.ghostAfter.split("\n")[0]), `the rest ${JSON.stringify(rest)} is not shown after ${key} (ghost now ${JSON.stringify(d.ghostAfter)})`);
      const stats = await serverStats();
      d.stats = stats;
      check(stats.partially_accepted >= 1 + (statsBefore?.partially_accepted ?? 0) || (kind === "line" && stats.partially_accepted >= 1), `the server counted no partial accept: ${stats.text}`);
      statsBefore = stats;
      await page.keyboard.press("Escape");
      await deleteTypedLine();
    });
  await step("typing-through-ghost-text-and-esc", async (d) => {
    await page.keyboard.press("Escape");
    await page.keyboard.press("End");
    await page.keyboard.press("Enter");
    await page.keyboard.press("Enter");
    const r = await typeUntilGhost(cfg.ghost.type, null, cfg.ghost.pauseMs ?? 6000);
    d.typed = r.typed;
    d.ghost = r.ghost;
    check(r.ghost, `no ghost text appeared after typing ${JSON.stringify(r.typed)}`);
    const first = r.ghost[0];
    check(first !== "\n", `the ghost text starts with a line break: ${JSON.stringify(r.ghost)}`);
    // Typing what the ghost text says should keep the rest of it on screen, as in Copilot.
    // VS Code 1.139 sometimes drops it although the server answers with the rest (its prefix
    // cache; VS Code's own fetch log shows the answer): recorded as a warning, not a failure.
    await page.keyboard.type(first);
    d.rest = await until(
      "the rest of the ghost text after typing its first character",
      async () => {
        const g = await ghostText();
        return g && g === r.ghost.slice(1) ? g : null;
      },
      5000,
    ).catch(async () => ({ shown: await ghostText() }));
    if (d.rest !== r.ghost.slice(1)) {
      const shown = d.rest.shown;
      check(!shown, `after typing ${JSON.stringify(first)} the ghost text is ${JSON.stringify(shown)}, expected ${JSON.stringify(r.ghost.slice(1))}`);
      warn(`typing ${JSON.stringify(first)}, the first character of the ghost text, made VS Code drop the rest of it`);
    }
    await shot("typed-through-one-character");
    await page.keyboard.press("Escape");
    await page.waitForTimeout(300);
    d.afterEsc = await ghostText();
    check(d.afterEsc === "", `Esc left ghost text on screen: ${JSON.stringify(d.afterEsc)}`);
    await deleteTypedLine();
  });
  await partial("word-accept", "Control+ArrowRight", "word");
  await partial("line-accept", "Control+Alt+ArrowRight", "line");

  await step("status-bar-click-turns-suggestions-off-and-on", async (d) => {
    await page.click(STATUS);
    d.off = await until("the status to say suggestions are off", async () => {
      const s = await statusItem();
      return s && /suggestions off/.test(s.label) ? s : null;
    }, 10000);
    await shot("suggestions-off");
    await page.click(STATUS);
    d.on = await until("the status to say suggestions are on again", async () => {
      const s = await statusItem();
      return s && /dlm: ready/.test(s.label) && !/suggestions off/.test(s.label) ? s : null;
    }, 10000);
  });

  await step("edit-prediction-shows-and-applies", async (d) => {
    if (cfg.lowerGateForEdits) {
      // The ghost text above passed the server's default gate (a completion the repository
      // memory knows). The model's own edit predictions are weak: a user who wants to see them
      // lowers the gate, as the test does here (each setting restarts the server).
      await setSetting("dlm.minConfidence", 0);
      await serverRestarted(d);
    }
    // On by default; the test's settings turned them off for the ghost-text steps above.
    await setSetting("dlm.editPredictions", true, { isDefault: true });
    // The setting restarts the server (its initializationOptions changed).
    await serverRestarted(d);
    // The restart reset the server's counters.
    await showAndApplyEditPrediction(d, "inlineEdit", 0, cfg.editPrediction.renames?.[0]);
  });

  await step("edit-prediction-as-decorations", async (d) => {
    // Where VS Code does not allow the extension the proposed API (a stable VS Code started
    // without --enable-proposed-api), edit predictions are decorations: the same from the Settings.
    const before = await serverStats();
    await setSetting("dlm.editPredictionDisplay", "decorations");
    await showAndApplyEditPrediction(d, "decoration", before.accepted, cfg.editPrediction.renames?.[1]);
  });

  await step("edit-prediction-in-another-file", async (d) => {
    // The renames above were each made twice (by hand, then by Tab) and no use is left in
    // shapes.py; pkg/geometry.py still defines the old names. The server answers a jump there
    // (docs/next-edits.md, "Another file"): a hint at the cursor's line; Tab opens the file at
    // the site, and there the edit itself is proposed and applied like any other.
    const acceptedBefore = (await serverStats()).accepted; // first: the command palette's Esc clears hints
    await openFile(cfg.file);
    await page.keyboard.press("Escape");
    await page.keyboard.press("Control+Home");
    await page.keyboard.press("End");
    d.hint = await until("a hint to jump to another file", jumpHintOnScreen, cfg.editPrediction.waitMs ?? 15000);
    check(d.hint.includes(cfg.otherFile), `the hint ${JSON.stringify(d.hint)} does not name ${cfg.otherFile}`);
    await shot("jump-to-another-file-hint");
    await page.keyboard.press("Tab");
    const name = path.basename(cfg.otherFile);
    d.tab = await until(`the editor to show ${name}`, async () => ((await activeTab()).includes(name) ? await activeTab() : null), 10000);
    d.cursor = await cursorPosition();
    const before = await editorLines();
    check((before[d.cursor?.line ?? -1] ?? "").includes("def "), `the cursor is not at a def of ${name}: ${JSON.stringify(d.cursor)}`);
    d.shown = await until(`the edit prediction in ${name}`, editPredictionOnScreen, cfg.editPrediction.waitMs ?? 15000);
    check(d.shown.kind === "decoration", `the edit prediction shows as ${d.shown.kind}, expected decoration`);
    await shot("edit-in-the-other-file");
    await page.keyboard.press("Tab");
    await page.waitForTimeout(800);
    const after = await editorLines();
    d.diff = insertedText(before, after);
    // the def of one of the renamed names now has its new name, and nothing else changed
    const carried = cfg.editPrediction.renames.find((r) => before.join("\n").replace(`def ${r.old}(`, `def ${r.new}(`) === after.join("\n"));
    check(carried, `Tab in ${name} did not carry a rename to its def: ${JSON.stringify(d.diff)}`);
    d.carried = carried;
    d.stats = await serverStats();
    check(d.stats.accepted >= acceptedBefore + 1, `the server counted no accept of the edit in ${name}: ${d.stats.text}`);
  });

  await step("restart-server", async (d) => {
    await statusReady(120000);
    await clearNotifications();
    await runCommand("dlm: Restart Server");
    await serverRestarted(d);
  });

  await step("wrong-server-path-shows-the-error-and-hint", async (d) => {
    await clearNotifications();
    await setSetting("dlm.server.path", cfg.wrongServerPath);
    const text = await until(
      "the error notification",
      async () => (await notifications()).find((t) => /^dlm: (cannot|could not) start/.test(t)),
      60000,
    );
    await page.waitForTimeout(1000); // a second notification about the same failure would be here by now
    d.notifications = await notifications();
    d.notification = text;
    d.status = await statusItem();
    check(text.includes(cfg.wrongServerPath), `the error does not name the path: ${text}`);
    check(/dlm\.server\.path/.test(text) && /pip install/.test(text), `the error has no hint (install, then set dlm.server.path): ${text}`);
    check(d.status && /failed/.test(d.status.label), `the status bar does not show the failure: ${JSON.stringify(d.status)}`);
    const others = d.notifications.filter((t) => t !== text && /dlm|dlm-lsp/.test(t));
    check(!others.length, `more than one notification about the failure: ${JSON.stringify(others)}`);
  });
}

main().then(
  () => process.exit(report.steps.every((s) => s.ok) ? 0 : 1),
  (e) => {
    console.error(e);
    fs.writeFileSync(cfg.report, JSON.stringify({ ...report, fatal: String(e && e.stack ? e.stack : e) }, null, 2));
    process.exit(2);
  },
);

-- Edit predictions (dlm/editPrediction): edits away from the cursor, shown as
-- virtual text at the end of their first line; accept applies them all, and tells the server
-- first (dlm/acceptedEdit: the edit memory counts an accepted next edit as the pattern made
-- again). An edit outside the window has a hint at the window's edge. A next edit in another
-- file comes as a jump with no edits: a hint at the cursor's line, and accept opens that file
-- where the edit starts (the server answers the edit there).
local dlm = require("dlm")
local M = {}

M.ns = vim.api.nvim_create_namespace("dlm.edit")
local state = {} -- bufnr -> { pred, timer, req_id }

local function buf(b)
  return (b == 0 or b == nil) and vim.api.nvim_get_current_buf() or b
end

function M.clear(bufnr)
  bufnr = buf(bufnr)
  local s = state[bufnr]
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
  if s then
    s.edge_mark = nil
  end
  if s and s.pred then
    s.pred = nil
    return true
  end
  return false
end

local function one_line(text)
  local lines = vim.split(text, "\n", { plain = true })
  local s = lines[1]
  if #lines > 1 then
    s = s .. string.format(" ⏎ … (+%d lines)", #lines - 1)
  end
  if #s > 80 then
    s = s:sub(1, 79) .. "…"
  end
  return s
end

local function is_count(x)
  return type(x) == "number" and x >= 0 and x == math.floor(x) and x < math.huge
end

local function uri_basename(uri)
  local ok, fname = pcall(vim.uri_to_fname, uri)
  local name = vim.fs.basename(ok and fname or uri)
  return (name ~= nil and name ~= "") and name or uri
end

--- A `jump` to another file ({uri, path?, position, label}) as the plugin uses it; nil when it
--- is not one (no uri, a bad position, no label). `path` falls back to the uri's file name.
function M.file_jump(j)
  if type(j) ~= "table" or type(j.uri) ~= "string" or not j.uri:match("^%a[%w+.-]*:.") then
    return nil
  end
  local p = j.position
  if type(p) ~= "table" or not is_count(p.line) or not is_count(p.character) or type(j.label) ~= "string" then
    return nil
  end
  local path = (type(j.path) == "string" and vim.trim(j.path) ~= "") and j.path or uri_basename(j.uri)
  return { uri = j.uri, path = path, position = { line = p.line, character = p.character }, label = j.label }
end

--- The text of a "jump to another file" hint: `⇥ pkg/b.py:13: rename count → tally`.
function M.file_jump_text(fj)
  return string.format("⇥ %s:%d: %s", one_line(fj.path), fj.position.line + 1, one_line(fj.label))
end

--- Whether an edit replaces or inserts whole lines: its range runs from column 0 to column 0
--- of a later line, or it inserts text that ends in a line break at column 0. Its text's last
--- line break ends its last line (no line of its own), and it is about its first line.
local function whole_lines(e)
  local r = e.range
  if r.start.character ~= 0 or r["end"].character ~= 0 then
    return false
  end
  return r["end"].line > r.start.line or e.newText:sub(-1) == "\n"
end

--- The virtual text of an edit: `✎ new text` (a whole-line edit's text without the line break
--- that ends it), `✎ delete` for a deletion.
local function edit_label(e)
  if e.newText == "" then
    return "✎ delete"
  end
  local text = e.newText
  if whole_lines(e) then
    text = text:gsub("\r?\n$", "")
  end
  return "✎ " .. one_line(text)
end

--- The window that shows `bufnr`: the current one when it does, else the first that does; nil when none.
local function window_of(bufnr)
  local cur = vim.api.nvim_get_current_win()
  if vim.api.nvim_win_get_buf(cur) == bufnr then
    return cur
  end
  local win = vim.fn.bufwinid(bufnr)
  return win ~= -1 and win or nil
end

--- The hint at the window's edge for an edit outside it: `↓ next edit: line 124: <label>` on
--- the last visible line (the edit is below), `↑ ...` on the first (above); `nil` when the
--- edit is in view, when there is no window, or when the prediction has a hint of its own at
--- the cursor's line (a jump: far from the cursor, or in another file).
function M.edge_hint(bufnr, pred)
  if type(pred) ~= "table" or pred.file_jump or pred.jump ~= nil or type(pred.edits) ~= "table" then
    return nil
  end
  local first = pred.edits[1]
  local win = window_of(bufnr)
  if not first or not win then
    return nil
  end
  local nlines = vim.api.nvim_buf_line_count(bufnr)
  local row = math.min(first.range.start.line, nlines - 1) -- 0-based: the edit's first line
  local top, bottom = vim.fn.line("w0", win) - 1, vim.fn.line("w$", win) - 1
  local label = type(pred.label) == "string" and pred.label or edit_label(first)
  if row < top then
    return { row = top, text = string.format("↑ next edit: line %d: %s", row + 1, one_line(label)) }
  elseif row > bottom then
    return { row = bottom, text = string.format("↓ next edit: line %d: %s", row + 1, one_line(label)) }
  end
  return nil
end

--- Place (again) the edge hint of the shown prediction of `bufnr` for where its window is now.
function M.refresh_edge(bufnr)
  bufnr = buf(bufnr)
  local s = state[bufnr]
  if not s or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  if s.edge_mark then
    pcall(vim.api.nvim_buf_del_extmark, bufnr, M.ns, s.edge_mark)
    s.edge_mark = nil
  end
  local hint = s.pred and M.edge_hint(bufnr, s.pred)
  if hint then
    s.edge_mark = vim.api.nvim_buf_set_extmark(bufnr, M.ns, hint.row, 0, {
      virt_text = { { hint.text, "DlmEditPrediction" } },
      virt_text_pos = "eol",
    })
  end
end

local function show(bufnr, client, pred)
  vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  local s = state[bufnr]
  s.edge_mark = nil
  if pred.file_jump then
    -- the next edit is in another file: a hint at the cursor's line (accept opens it there)
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    vim.api.nvim_buf_set_extmark(bufnr, M.ns, math.min(row, vim.api.nvim_buf_line_count(bufnr) - 1), 0, {
      virt_text = { { M.file_jump_text(pred.file_jump), "DlmEditPrediction" } },
      virt_text_pos = "eol",
    })
    return
  end
  local enc = client.offset_encoding or "utf-16"
  local nlines = vim.api.nvim_buf_line_count(bufnr)
  for _, e in ipairs(pred.edits) do
    local r = e.range
    local whole = whole_lines(e)
    -- a whole-line edit may end at column 0 of the line after the buffer's last (the end of the text)
    local last = whole and r["end"].line > r.start.line and r["end"].line - 1 or r["end"].line
    if r.start.line < nlines and last < nlines then
      local sc = vim.lsp.util._get_line_byte_from_position(bufnr, r.start, enc)
      local er, ec
      if whole then
        -- to the end of its last line: nothing of the line after it is marked
        er = last
        ec = #(vim.api.nvim_buf_get_lines(bufnr, last, last + 1, false)[1] or "")
      else
        er, ec = r["end"].line, vim.lsp.util._get_line_byte_from_position(bufnr, r["end"], enc)
      end
      if r.start.line ~= r["end"].line or r.start.character ~= r["end"].character then
        vim.api.nvim_buf_set_extmark(bufnr, M.ns, r.start.line, sc, {
          end_row = er, end_col = ec, hl_group = "DlmEditPredictionDelete",
        })
      end
      -- on the edit's first line: the line it changes (a multi-line range ends on a later
      -- line, and a whole-line one at column 0 of the line after it, which it leaves alone)
      vim.api.nvim_buf_set_extmark(bufnr, M.ns, r.start.line, 0, {
        virt_text = { { edit_label(e), "DlmEditPrediction" } },
        virt_text_pos = "eol",
      })
    end
  end
  local j = pred.jump
  if type(j) == "table" and type(j.position) == "table" and type(j.position.line) == "number" then
    -- far from the cursor (docs/next-edits.md): a "jump to" hint at the cursor's line
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local arrow = (tonumber(j.lines) or 0) < 0 and "↑" or "↓"
    vim.api.nvim_buf_set_extmark(bufnr, M.ns, math.min(row, nlines - 1), 0, {
      virt_text = { { string.format("⇥ %s line %d: %s", arrow, j.position.line + 1, one_line(tostring(j.label or ""))),
        "DlmEditPrediction" } },
      virt_text_pos = "eol",
    })
  end
  M.refresh_edge(bufnr)
end

--- A dlm/editPrediction answer for `bufnr` (current, text at changedtick `tick` when asked;
--- nil: now): kept and shown when it is one to show, else ignored. Returns whether it is shown.
function M.receive(bufnr, client, pred, tick)
  bufnr = buf(bufnr)
  if type(pred) ~= "table" or type(pred.edits) ~= "table" then
    return false
  end
  local file_jump = nil
  if #pred.edits == 0 then
    -- no edit here: only a jump to another file is worth showing (a malformed one is not)
    file_jump = M.file_jump(pred.jump)
    if not file_jump then
      return false
    end
  end
  if not vim.api.nvim_buf_is_valid(bufnr) or (tick and vim.api.nvim_buf_get_changedtick(bufnr) ~= tick) then
    return false
  end
  local version = vim.lsp.util.buf_versions[bufnr]
  if version ~= nil and pred.version ~= version then
    return false -- computed for older text: the ranges would be wrong
  end
  local s = state[bufnr] or {}
  state[bufnr] = s
  if file_jump then
    pred = vim.tbl_extend("force", pred, { file_jump = file_jump })
  end
  s.pred = pred
  show(bufnr, client, pred)
  return true
end

function M.request(bufnr)
  bufnr = buf(bufnr)
  local client = dlm.client(bufnr)
  if not client or not dlm.enabled or vim.api.nvim_get_current_buf() ~= bufnr then
    return
  end
  local s = state[bufnr] or {}
  state[bufnr] = s
  if s.req_id then
    dlm.cancel(client, s.req_id)
  end
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding or "utf-16")
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local ok, id = dlm.request(client, "dlm/editPrediction", {
    textDocument = params.textDocument, position = params.position,
  }, function(err, pred)
    s.req_id = nil
    if not err then
      M.receive(bufnr, client, pred, tick)
    end
  end, bufnr)
  if ok then
    s.req_id = id
  end
end

--- Ask for the buffer's next edit after the usual delay (one timer per buffer: a burst of
--- cursor moves asks once).
local function request_soon(bufnr)
  local s = state[bufnr]
  if not s then
    return
  end
  s.timer = s.timer or vim.uv.new_timer()
  s.timer:stop()
  s.timer:start(dlm.config.edit_prediction_delay_ms, 0, vim.schedule_wrap(function()
    M.request(bufnr)
  end))
end

--- An LSP position (`enc`: the client's offset encoding) -> the window cursor {row, byte col}
--- in `bufnr`, clamped to its text (the file may have changed since the server read it).
function M.cursor_at(bufnr, position, enc)
  local row = math.min(position.line, vim.api.nvim_buf_line_count(bufnr) - 1)
  local col = 0
  if row == position.line then
    local ok, c = pcall(vim.lsp.util._get_line_byte_from_position, bufnr,
      { line = row, character = position.character }, enc)
    local len = #(vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or "")
    col = ok and math.min(c, len) or 0
  end
  return { row + 1, col }
end

local function loaded_buffer(fname)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) and vim.api.nvim_buf_get_name(b) == fname then
      return b
    end
  end
  return nil
end

--- Accept on a "jump to another file" hint: open the file (its buffer when loaded) in the
--- current window with the cursor where the edit starts. Nothing is edited, nothing accepted
--- on the server: the buffer's own trigger asks for its next edit, which the server answers.
local function open_file_jump(fj, enc)
  local why = nil
  local ok, fname = pcall(vim.uri_to_fname, fj.uri)
  local target = ok and loaded_buffer(fname) or nil
  if not ok then
    why = "its uri " .. fj.uri .. " names no file"
  elseif target then
    local set, err = pcall(vim.api.nvim_win_set_buf, 0, target)
    why = not set and tostring(err) or nil
  elseif not vim.uv.fs_stat(fname) then
    why = fname .. " does not exist (deleted or moved since the hint was shown?)"
  else
    local opened, err = pcall(vim.cmd.edit, vim.fn.fnameescape(fname))
    why = not opened and tostring(err) or nil
    target = opened and vim.api.nvim_get_current_buf() or nil
  end
  if why then
    vim.notify(string.format("dlm: cannot open %s for its next edit: %s; open it yourself, or keep editing "
      .. "and the next hint will follow", fj.path, why), vim.log.levels.WARN)
    return
  end
  pcall(vim.api.nvim_win_set_cursor, 0, M.cursor_at(target, fj.position, enc))
  -- CursorMoved need not fire (a new buffer with the cursor where the old one had it):
  -- ask here too; dlm.edit.attach ran for it when the LSP client attached (on_attach).
  request_soon(target)
end

function M.accept(bufnr)
  bufnr = buf(bufnr)
  local s = state[bufnr]
  local client = dlm.client(bufnr)
  if not s or not s.pred or not client then
    return false
  end
  local pred = s.pred
  M.clear(bufnr)
  if pred.file_jump then
    open_file_jump(pred.file_jump, client.offset_encoding or "utf-16")
    return true
  end
  if vim.lsp.util.buf_versions[bufnr] ~= pred.version then
    return false
  end
  if pred.id ~= nil then
    -- before the edit's didChange (the server has the text at pred.version, the one checked
    -- above): it takes that change as the accepted next edit, one edit of its own that counts as
    -- its pattern made again, so the pattern's other sites are proposed (lsp/next_edits.py)
    dlm.notify(client, "dlm/acceptedEdit", { id = pred.id, textDocument = { uri = vim.uri_from_bufnr(bufnr) } })
  end
  vim.lsp.util.apply_text_edits(pred.edits, bufnr, client.offset_encoding or "utf-16")
  dlm.exec_accept(client, { command = "dlm.acceptCompletion", arguments = { pred.id } }, bufnr)
  return true
end

function M.current(bufnr)
  local s = state[buf(bufnr)]
  return s and s.pred or nil
end

-- A scrolled window may bring an edit into view or take it out: its edge hint follows.
vim.api.nvim_create_autocmd("WinScrolled", {
  group = vim.api.nvim_create_augroup("dlm.edit.scroll", { clear = true }),
  callback = function()
    local seen = {}
    for key in pairs(vim.v.event or {}) do
      local win = tonumber(key)
      if win and vim.api.nvim_win_is_valid(win) then
        local b = vim.api.nvim_win_get_buf(win)
        if not seen[b] and state[b] and state[b].pred then
          seen[b] = true
          M.refresh_edge(b)
        end
      end
    end
  end,
})

function M.attach(bufnr)
  local s = state[bufnr] or {}
  state[bufnr] = s
  if s.attached then
    return
  end
  s.attached = true
  local group = vim.api.nvim_create_augroup("dlm.edit." .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI", "CursorMoved", "CursorMovedI" }, {
    group = group,
    buffer = bufnr,
    callback = function(ev)
      if ev.event:match("^TextChanged") then
        M.clear(bufnr)
      end
      request_soon(bufnr)
    end,
  })
end

return M

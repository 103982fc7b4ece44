-- Ghost text for Neovim 0.10/0.11 (no vim.lsp.inline_completion): our own
-- textDocument/inlineCompletion requests after each keystroke in insert mode,
-- shown with an extmark (inline virtual text + virtual lines). The server may
-- list alternatives after its answer: the plugin keeps the list, next/prev cycle
-- through it, a "2/3" hint at the end of the line says which one is shown, and
-- accept inserts that one.
local dlm = require("dlm")
local M = {}

M.ns = vim.api.nvim_create_namespace("dlm.ghost")
-- the "i/n" hint: an extmark of its own, so that M.ns holds exactly the ghost text
M.hint_ns = vim.api.nvim_create_namespace("dlm.ghost.hint")
local state = {} -- bufnr -> { items, index, row, col, tick, extmark, req_id, timer }

local function st(bufnr)
  state[bufnr] = state[bufnr] or {}
  return state[bufnr]
end

function M.clear(bufnr)
  bufnr = bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr
  local s = state[bufnr]
  if not s then
    return false
  end
  local had = s.items ~= nil
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
    vim.api.nvim_buf_clear_namespace(bufnr, M.hint_ns, 0, -1)
  end
  s.items, s.index, s.shown = nil, nil, nil
  return had
end

M.dismiss = function()
  return M.clear(0)
end

--- The item's range as 0-based (row, byte col) pairs; no range: the cursor.
local function item_range(bufnr, client, item, row, col)
  if not item.range then
    return row, col, row, col
  end
  local enc = client.offset_encoding or "utf-16"
  local r = item.range
  local sc = vim.lsp.util._get_line_byte_from_position(bufnr, r.start, enc)
  local ec = vim.lsp.util._get_line_byte_from_position(bufnr, r["end"], enc)
  return r.start.line, sc, r["end"].line, ec
end

--- What is shown for an item: the text minus what is already typed between the range start and the cursor.
function M.display(bufnr, client, item, row, col)
  local text = type(item.insertText) == "table" and item.insertText.value or item.insertText
  local sr, sc = item_range(bufnr, client, item, row, col)
  if sr == row and sc <= col then
    local typed = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, true)[1]:sub(sc + 1, col)
    if text:sub(1, #typed) == typed then
      return text:sub(#typed + 1)
    end
  end
  return text
end

--- The "i/n" hint of a list of several items (nil for one item).
function M.hint(s)
  if not s or not s.items or #s.items < 2 then
    return nil
  end
  return string.format("%d/%d", s.index, #s.items)
end

local function show(bufnr)
  local s = st(bufnr)
  local client = dlm.client(bufnr)
  local item = s.items and s.items[s.index]
  vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  vim.api.nvim_buf_clear_namespace(bufnr, M.hint_ns, 0, -1)
  s.shown = nil -- set below when this item draws something (accept inserts only a shown item)
  if not item or not client then
    return
  end
  local text = M.display(bufnr, client, item, s.row, s.col)
  if text == "" then
    return
  end
  local lines = vim.split(text, "\n", { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = { { lines[i], "DlmGhostText" } }
  end
  s.shown = text
  s.extmark = vim.api.nvim_buf_set_extmark(bufnr, M.ns, s.row, s.col, {
    virt_text = { { lines[1], "DlmGhostText" } },
    virt_text_pos = "inline",
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = "combine",
  })
  local hint = M.hint(s)
  if hint then
    vim.api.nvim_buf_set_extmark(bufnr, M.hint_ns, s.row, 0, {
      virt_text = { { " " .. hint, "DlmGhostText" } },
      virt_text_pos = "eol",
      hl_mode = "combine",
    })
  end
  dlm.notify(client, "textDocument/didShowCompletion", { item = item })
end

function M.request(bufnr, trigger_kind)
  bufnr = bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr
  local client = dlm.client(bufnr)
  if not client or not dlm.enabled then
    return
  end
  local s = st(bufnr)
  if s.req_id then
    dlm.cancel(client, s.req_id)
    s.req_id = nil
  end
  local cur = vim.api.nvim_win_get_cursor(0)
  local row, col = cur[1] - 1, cur[2]
  local tick = vim.api.nvim_buf_get_changedtick(bufnr)
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding or "utf-16")
  params.context = { triggerKind = trigger_kind or 2 } -- 2 = Automatic
  local id -- set below; the handler compares it (a local declared in the same statement is not in scope yet)
  local ok, rid = dlm.request(client, "textDocument/inlineCompletion", params, function(err, result)
    if s.req_id == id then
      s.req_id = nil
    end
    -- What the server answered, for whom (tests compare the ghost text with it).
    s.last_response = {
      items = result and (result.items or result) or nil,
      err = err and tostring(err.message or err) or nil,
      row = row, col = col, tick = tick,
    }
    if err or not result or not vim.api.nvim_buf_is_valid(bufnr) then
      return
    end
    -- Stale: the user typed or moved since the request went out.
    local now = vim.api.nvim_get_current_buf() == bufnr and vim.api.nvim_win_get_cursor(0) or nil
    if vim.api.nvim_buf_get_changedtick(bufnr) ~= tick or not now or now[1] - 1 ~= row or now[2] ~= col then
      return
    end
    if not vim.api.nvim_get_mode().mode:match("^i") then
      return
    end
    local items = result.items or result
    if #items == 0 then
      -- An explicit trigger says why nothing came: the server's dlm/status `trigger`, sent
      -- before this answer.
      local t = trigger_kind == 1 and type(dlm.status) == "table" and dlm.status.trigger or nil
      if type(t) == "table" and t.shown == false and type(t.reason) == "string" and t.reason ~= "" then
        vim.notify("dlm: no suggestion: " .. t.reason, vim.log.levels.INFO)
      end
      return
    end
    s.items, s.index, s.row, s.col, s.tick = items, 1, row, col, tick
    show(bufnr)
  end, bufnr)
  if ok then
    id = rid
    s.req_id = rid
  end
end

function M.accept()
  local bufnr = vim.api.nvim_get_current_buf()
  local s = state[bufnr]
  local client = dlm.client(bufnr)
  local item = s and s.items and s.items[s.index]
  if not item or not client or not s.shown or vim.api.nvim_buf_get_changedtick(bufnr) ~= s.tick then
    return false
  end
  local text = type(item.insertText) == "table" and item.insertText.value or item.insertText
  local sr, sc, er, ec = item_range(bufnr, client, item, s.row, s.col)
  M.clear(bufnr)
  local lines = vim.split(text, "\n", { plain = true })
  vim.api.nvim_buf_set_text(bufnr, sr, sc, er, ec, lines)
  local last = #lines == 1 and sc + #lines[1] or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { sr + #lines, last })
  dlm.exec_accept(client, item.command, bufnr)
  return true
end

--- Show the item `step` places on in the list (wrapping around), when it holds several and
--- the text has not changed since; else ask the server again (1 = Invoked).
function M.cycle(step)
  local bufnr = vim.api.nvim_get_current_buf()
  local s = state[bufnr]
  if s and s.items and #s.items > 1 and vim.api.nvim_buf_get_changedtick(bufnr) == s.tick then
    s.index = (s.index - 1 + step) % #s.items + 1
    show(bufnr)
    return true
  end
  M.request(bufnr, 1)
  return true
end

--- Test/statusline helper: the text shown now (nil when none).
function M.shown(bufnr)
  local s = state[bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr]
  return s and s.items and s.shown or nil
end

--- Test helper: whether a request of the plugin is in flight (or about to be sent).
function M.pending(bufnr)
  local s = state[bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr]
  return s ~= nil and (s.req_id ~= nil or (s.timer ~= nil and s.timer:get_due_in() > 0))
end

--- Test helper: the last inline-completion answer the plugin received, with the
--- position and changedtick it was asked for: { items, err, row, col, tick } (nil when none).
function M.last_response(bufnr)
  local s = state[bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr]
  return s and s.last_response or nil
end

function M.current_item(bufnr)
  local s = state[bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr]
  return s and s.items and s.items[s.index] or nil
end

--- Test/statusline helper: which item of how many is shown, { index, count } (nil when none).
function M.position(bufnr)
  local s = state[bufnr == 0 and vim.api.nvim_get_current_buf() or bufnr]
  return s and s.items and { s.index, #s.items } or nil
end

function M.attach(bufnr)
  local s = st(bufnr)
  if s.attached then
    return
  end
  s.attached = true
  local group = vim.api.nvim_create_augroup("dlm.ghost." .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ "TextChangedI", "TextChangedP" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr)
      if s.timer then
        s.timer:stop()
      end
      s.timer = s.timer or vim.uv.new_timer()
      s.timer:start(dlm.config.debounce_ms, 0, vim.schedule_wrap(function()
        M.request(bufnr)
      end))
    end,
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.clear(bufnr)
    end,
  })
  vim.api.nvim_create_autocmd("CursorMovedI", {
    group = group,
    buffer = bufnr,
    callback = function()
      local s2 = state[bufnr]
      if s2 and s2.items then
        local c = vim.api.nvim_win_get_cursor(0)
        if c[1] - 1 ~= s2.row or c[2] ~= s2.col then
          M.clear(bufnr)
        end
      end
    end,
  })
end

return M

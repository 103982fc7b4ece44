-- Edit predictions (dlm/editPrediction): edits away from the cursor, shown as
-- virtual text at the end of their line; accept applies them all.
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

local function show(bufnr, client, pred)
  vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  local enc = client.offset_encoding or "utf-16"
  local nlines = vim.api.nvim_buf_line_count(bufnr)
  for _, e in ipairs(pred.edits) do
    local r = e.range
    if r.start.line < nlines and r["end"].line < nlines then
      local sc = vim.lsp.util._get_line_byte_from_position(bufnr, r.start, enc)
      local ec = vim.lsp.util._get_line_byte_from_position(bufnr, r["end"], enc)
      if r.start.line ~= r["end"].line or sc ~= ec then
        vim.api.nvim_buf_set_extmark(bufnr, M.ns, r.start.line, sc, {
          end_row = r["end"].line, end_col = ec, hl_group = "DlmEditPredictionDelete",
        })
      end
      local label = e.newText == "" and "✎ delete" or ("✎ " .. one_line(e.newText))
      vim.api.nvim_buf_set_extmark(bufnr, M.ns, r["end"].line, 0, {
        virt_text = { { label, "DlmEditPrediction" } },
        virt_text_pos = "eol",
      })
    end
  end
  local j = pred.jump
  if type(j) == "table" and type(j.position) == "table" and type(j.position.line) == "number" then
    -- far from the cursor (README "Next edits"): a "jump to" hint at the cursor's line
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local arrow = (tonumber(j.lines) or 0) < 0 and "↑" or "↓"
    vim.api.nvim_buf_set_extmark(bufnr, M.ns, math.min(row, nlines - 1), 0, {
      virt_text = { { string.format("⇥ %s line %d: %s", arrow, j.position.line + 1, one_line(tostring(j.label or ""))),
        "DlmEditPrediction" } },
      virt_text_pos = "eol",
    })
  end
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
    if err or type(pred) ~= "table" or type(pred.edits) ~= "table" or #pred.edits == 0 then
      return
    end
    if not vim.api.nvim_buf_is_valid(bufnr) or vim.api.nvim_buf_get_changedtick(bufnr) ~= tick then
      return
    end
    local version = vim.lsp.util.buf_versions[bufnr]
    if version ~= nil and pred.version ~= version then
      return -- computed for older text: the ranges would be wrong
    end
    s.pred = pred
    show(bufnr, client, pred)
  end, bufnr)
  if ok then
    s.req_id = id
  end
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
  if vim.lsp.util.buf_versions[bufnr] ~= pred.version then
    return false
  end
  vim.lsp.util.apply_text_edits(pred.edits, bufnr, client.offset_encoding or "utf-16")
  dlm.exec_accept(client, { command = "dlm.acceptCompletion", arguments = { pred.id } }, bufnr)
  return true
end

function M.current(bufnr)
  local s = state[buf(bufnr)]
  return s and s.pred or nil
end

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
      s.timer = s.timer or vim.uv.new_timer()
      s.timer:stop()
      s.timer:start(dlm.config.edit_prediction_delay_ms, 0, vim.schedule_wrap(function()
        M.request(bufnr)
      end))
    end,
  })
end

return M

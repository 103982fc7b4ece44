-- dlm-lsp for Neovim: starts `dlm-lsp --stdio` through vim.lsp, shows inline
-- completions (native vim.lsp.inline_completion on 0.12+, own ghost text on
-- 0.10/0.11) and edit predictions (dlm/editPrediction) as virtual text.
local M = {}

-- The server is not on PyPI (the name dlm-lsp there is another project): it is
-- installed from a clone of the repository into a virtualenv, whose bin/ is
-- usually not on Neovim's PATH, so server_path should be the full path.
M.install_hint = "install the server from a clone of the dlm-lsp repository "
  .. "(python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .) and set server_path "
  .. "to the full path of the venv's bin/dlm-lsp, e.g. require('dlm').setup({ server_path = "
  .. "'/path/to/dlm-lsp/.venv/bin/dlm-lsp' })"

M.defaults = {
  cmd = nil, -- full command line; nil: built from the fields below
  server_path = "dlm-lsp", -- better: the full path, e.g. "/path/to/dlm-lsp/.venv/bin/dlm-lsp"
  model = nil, -- checkpoint directory (--model)
  device = nil, -- "cpu" | "cuda" | "auto"
  remote = nil, -- "HOST:PORT" of `dlm-lsp serve` (--remote)
  token_file = nil,
  tls = false,
  -- The server's own log (--log-file), with its levels. Its stderr would land in
  -- Neovim's lsp.log, which records every stderr line as [ERROR] whatever its level;
  -- with a log file only real failures (tracebacks) reach stderr. nil: stdpath("log")
  -- .. "/dlm-lsp.log"; false: leave the logs on stderr. Not used with `cmd`.
  log_file = nil,
  log_level = nil, -- "DEBUG" | "INFO" | "WARNING" | "ERROR" (--log-level); nil: the server's default
  filetypes = nil, -- nil: every normal file buffer
  native = nil, -- nil: use vim.lsp.inline_completion when it exists (0.12+)
  debounce_ms = 30, -- own ghost text: wait this long after a keystroke
  edit_predictions = true, -- the edit memory's next edits (docs/next-edits.md); sent to the server too
  min_confidence = nil, -- show only suggestions at least this confident (0..1); nil: the server's measured default
  deadline_ms = nil, -- a suggestion not ready this long after the keystroke is not shown; nil: 250
  server_options = nil, -- any other initializationOptions (docs/configuration.md), e.g. { context = { idleMs = 400 } }
  -- a model server instead of the embedded model (docs/engines.md), e.g. { kind = "mercury-edit" }; sent
  -- marked user-scoped: set it in your own config (an exrc is a project's, trusted by your :trust)
  engine = nil,
  edit_prediction_delay_ms = 300,
  -- next/prev cycle through the server's alternatives (next with none shown asks again)
  keymaps = { accept = "<Tab>", next = "<M-]>", prev = "<M-[>", dismiss = "<C-]>", accept_edit = "<M-CR>" },
}

M.config = vim.deepcopy(M.defaults)
M.enabled = true
M.status = nil -- last dlm/status notification

--- The server's log file (nil when the logs go to stderr, or `cmd` is set by hand).
function M.log_file(o)
  o = o or M.config
  if o.cmd or o.log_file == false then
    return nil
  end
  return o.log_file or (vim.fn.stdpath("log") .. "/dlm-lsp.log")
end

--- Options -> the server's initializationOptions (docs/configuration.md).
function M.init_options(o)
  local opts = vim.deepcopy(o.server_options or {})
  opts.editPredictions = o.edit_predictions and true or false
  if o.min_confidence ~= nil then
    opts.minConfidence = o.min_confidence
  end
  if o.deadline_ms ~= nil then
    opts.deadlineMs = o.deadline_ms
  end
  if type(o.engine) == "table" then
    opts.engine = vim.tbl_extend("force", vim.deepcopy(o.engine), { scope = "user" })
  end
  return opts
end

--- Options -> server command line (the same rules as the VS Code extension).
function M.build_cmd(o)
  if o.cmd then
    return o.cmd
  end
  local cmd = { o.server_path or "dlm-lsp", "--stdio" }
  if o.remote and o.remote ~= "" then
    vim.list_extend(cmd, { "--remote", o.remote })
    if o.token_file then
      vim.list_extend(cmd, { "--token-file", o.token_file })
    end
    if o.tls then
      table.insert(cmd, "--tls")
    end
  else
    if o.model then
      vim.list_extend(cmd, { "--model", o.model })
    end
    if o.device and o.device ~= "auto" then
      vim.list_extend(cmd, { "--device", o.device })
    end
  end
  local log_file = M.log_file(o)
  if log_file then
    vim.fn.mkdir(vim.fs.dirname(log_file), "p")
    vim.list_extend(cmd, { "--log-file", log_file })
  end
  if o.log_level then
    vim.list_extend(cmd, { "--log-level", o.log_level })
  end
  return cmd
end

function M.use_native()
  if M.config.native ~= nil then
    return M.config.native
  end
  return vim.lsp.inline_completion ~= nil
end

function M.client(bufnr)
  local get = vim.lsp.get_clients or vim.lsp.get_active_clients
  return get({ name = "dlm", bufnr = bufnr })[1]
end

--- client:request on 0.11+, client.request before.
function M.request(client, method, params, handler, bufnr)
  if vim.fn.has("nvim-0.11") == 1 then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.notify(client, method, params)
  if vim.fn.has("nvim-0.11") == 1 then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

function M.cancel(client, id)
  if vim.fn.has("nvim-0.11") == 1 then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

--- Run the accept command of an item/prediction on the server (counts acceptances).
function M.exec_accept(client, command, bufnr)
  if command then
    M.request(client, "workspace/executeCommand", { command = command.command, arguments = command.arguments }, function() end, bufnr)
  end
end

--- The most frequent reason the server held answers back, or nil when it held none back.
function M.held_back_reason(st)
  if not st or (st.held_back or 0) == 0 then
    return nil
  end
  local reason, most = nil, 0
  for k, v in pairs(st.held_back_by or {}) do
    if v > most then
      reason, most = k, v
    end
  end
  return reason
end

--- The index's line of a dlm/status: "indexing 38/77 files", "index: ready (77 files)",
--- "index failed: <why>", "index off: <why>" (the server writes it); nil when the status has
--- no index part. `short`: a ready index's notes (files past a cap, a cache it cannot write)
--- are left to :DlmStatus, so that a statusline stays short; a failure keeps its reason.
function M.index_line(st, short)
  local idx = type(st) == "table" and st.index or nil
  if type(idx) ~= "table" or type(idx.text) ~= "string" or idx.text == "" then
    return nil
  end
  if short and idx.state == "ready" and type(idx.files) == "number"
      and type(idx.message) == "string" and idx.message ~= "" then
    return string.format("index: ready (%d file%s; notes in :DlmStatus)", idx.files, idx.files == 1 and "" or "s")
  end
  return idx.text
end

--- True while the workspace index is built or loaded: the status is not "ready" then.
function M.indexing(st)
  local idx = type(st) == "table" and st.index or nil
  return type(idx) == "table" and (idx.state == "loading" or idx.state == "indexing")
end

--- What the status says of the model: offered / held back, p50, device, message.
local function model_details(st)
  local s = ""
  if st.offered ~= nil then
    s = s .. string.format(" offered %d", st.offered)
    local reason = M.held_back_reason(st)
    if reason then
      s = s .. string.format(", held back %d (%s)", st.held_back, reason)
    end
  end
  if type(st.p50_ms) == "number" then
    s = s .. string.format(" p50 %d ms", math.floor(st.p50_ms + 0.5))
  end
  if type(st.device) == "string" and st.device ~= "" then
    s = s .. " (" .. st.device .. ")"
  end
  if type(st.message) == "string" and st.message ~= "" then
    s = s .. ": " .. st.message
  end
  return s
end

local function status_line(st, full)
  if not st then
    return "dlm: starting"
  end
  local index = M.index_line(st, not full)
  -- "ready" only when the model answers and the index is built: until then the index's count
  local building = st.state == "ready" and index ~= nil and M.indexing(st)
  local s = "dlm: " .. (building and index or st.state) .. model_details(st)
  if index and not building then
    s = s .. " · " .. index
  end
  return M.enabled and s or (s .. " [off]")
end

--- The model's part alone ("model: ready offered 3 p50 40 ms (cuda)"), for :checkhealth dlm,
--- which reports the index on a line of its own.
function M.model_line(st)
  st = st or M.status
  if not st then
    return "model: the server has not reported its status yet"
  end
  return "model: " .. st.state .. model_details(st) .. (M.enabled and "" or " [suggestions off]")
end

--- For a statusline: require('dlm').statusline()
function M.statusline()
  return status_line(M.status)
end

--- The statusline with the index's notes in full (:DlmStatus, :checkhealth dlm).
function M.status_text()
  return status_line(M.status, true)
end

--- A dlm/status notification: keep it, redraw the statuslines now (not at the next
--- keypress) and fire `User DlmStatus` for statusline plugins that cache.
function M.on_status(result)
  M.status = result
  vim.schedule(function()
    pcall(vim.cmd.redrawstatus, { bang = true })
    vim.api.nvim_exec_autocmds("User", { pattern = "DlmStatus", modeline = false })
  end)
end

--- Ghost text and edit predictions must read as suggestions in every terminal: a
--- colour that differs from Normal's in both GUI (termguicolors) and cterm (256-colour)
--- terms, and italic. Taken from `base` where that differs from Normal, else a grey.
local function suggestion_hl(base, fg, ctermfg)
  local normal = vim.api.nvim_get_hl(0, { name = "Normal", link = false })
  local b = vim.api.nvim_get_hl(0, { name = base, link = false })
  return {
    fg = (b.fg and b.fg ~= normal.fg) and b.fg or fg,
    ctermfg = (b.ctermfg and b.ctermfg ~= normal.ctermfg) and b.ctermfg or ctermfg,
    italic = true,
    cterm = { italic = true },
    default = true, -- a user's (or colorscheme's) own DlmGhostText wins
  }
end

function M.define_highlights()
  vim.api.nvim_set_hl(0, "DlmGhostText", suggestion_hl("Comment", "#808080", 242))
  vim.api.nvim_set_hl(0, "DlmEditPrediction", suggestion_hl("DiagnosticHint", "#6f9fbf", 109))
  vim.api.nvim_set_hl(0, "DlmEditPredictionDelete", {
    strikethrough = true, cterm = { strikethrough = true }, default = true,
  })
end

local function attach(bufnr)
  if not M.enabled or vim.bo[bufnr].buftype ~= "" or vim.api.nvim_buf_get_name(bufnr) == "" then
    return
  end
  local ft = vim.bo[bufnr].filetype
  if M.config.filetypes and not vim.tbl_contains(M.config.filetypes, ft) then
    return
  end
  local cmd = M.build_cmd(M.config)
  if vim.fn.executable(cmd[1]) ~= 1 then
    vim.notify_once("dlm: " .. cmd[1] .. " is not executable: " .. M.install_hint, vim.log.levels.ERROR)
    return
  end
  vim.lsp.start({
    name = "dlm",
    cmd = cmd,
    root_dir = vim.fn.getcwd(),
    init_options = M.init_options(M.config),
    handlers = {
      ["dlm/status"] = function(_, result)
        M.on_status(result)
      end,
    },
    on_attach = function(client, b)
      if M.use_native() then
        vim.lsp.inline_completion.enable(true, { bufnr = b })
      else
        require("dlm.ghost").attach(b)
      end
      if M.config.edit_predictions then
        require("dlm.edit").attach(b)
      end
    end,
  }, { bufnr = bufnr })
end

local function map(mode, lhs, fn, desc, fallback)
  if not lhs then
    return
  end
  vim.keymap.set(mode, lhs, function()
    if not fn() and fallback then
      vim.api.nvim_feedkeys(vim.keycode(lhs), "n", false)
    end
  end, { desc = desc })
end

function M.accept()
  if M.use_native() then
    local ic = vim.lsp.inline_completion
    -- get() accepts the shown item, or asks for one when none is shown; only accept here.
    local ns = vim.api.nvim_get_namespaces()["nvim.lsp.inline_completion"]
    local shown = ns ~= nil and #vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { limit = 1 }) > 0
    if shown then
      ic.get()
    end
    return shown
  end
  return require("dlm.ghost").accept()
end

--- Show the next (count 1) or previous (count -1) item of the inline list.
local function cycle(count)
  if M.use_native() then
    local ic = vim.lsp.inline_completion
    local f = ic.select or ic.jump
    if f then
      f({ count = count })
    end
    return true
  end
  return require("dlm.ghost").cycle(count)
end

function M.next()
  return cycle(1)
end

function M.prev()
  return cycle(-1)
end

function M.dismiss()
  local any = require("dlm.edit").clear(0)
  if M.use_native() then
    -- no public dismiss: re-enabling drops the shown candidate
    vim.lsp.inline_completion.enable(false, { bufnr = 0 })
    vim.lsp.inline_completion.enable(true, { bufnr = 0 })
    return true
  end
  return require("dlm.ghost").dismiss() or any
end

function M.toggle()
  M.enabled = not M.enabled
  if not M.enabled then
    for _, b in ipairs(vim.api.nvim_list_bufs()) do
      if vim.api.nvim_buf_is_loaded(b) then
        require("dlm.ghost").clear(b)
        require("dlm.edit").clear(b)
        if M.use_native() then
          vim.lsp.inline_completion.enable(false, { bufnr = b })
        end
      end
    end
  elseif M.use_native() then
    for _, b in ipairs(vim.api.nvim_list_bufs()) do
      if M.client(b) then
        vim.lsp.inline_completion.enable(true, { bufnr = b })
      end
    end
  end
  pcall(vim.cmd.redrawstatus, { bang = true })
  vim.notify("dlm: suggestions " .. (M.enabled and "on" or "off"))
end

function M.restart()
  local c = M.client()
  local bufs = {}
  if c then
    for b in pairs(c.attached_buffers or {}) do
      table.insert(bufs, b)
    end
    if vim.fn.has("nvim-0.11") == 1 then c:stop() else c.stop() end
  end
  M.status = nil
  vim.defer_fn(function()
    for _, b in ipairs(bufs) do
      if vim.api.nvim_buf_is_valid(b) then
        attach(b)
      end
    end
  end, 500)
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(M.defaults), opts or {})
  if vim.fn.has("nvim-0.10") ~= 1 then
    vim.notify("dlm: needs Neovim 0.10 or newer", vim.log.levels.ERROR)
    return
  end
  M.define_highlights()
  local group = vim.api.nvim_create_augroup("dlm", { clear = true })
  vim.api.nvim_create_autocmd("ColorScheme", { group = group, callback = M.define_highlights })
  vim.api.nvim_create_autocmd({ "FileType", "BufReadPost", "BufNewFile" }, {
    group = group,
    callback = function(ev)
      attach(ev.buf)
    end,
  })
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(b) then
      attach(b)
    end
  end
  local k = M.config.keymaps or {}
  map("i", k.accept, M.accept, "dlm: accept suggestion", true)
  map("i", k.next, M.next, "dlm: next suggestion", true)
  map("i", k.prev, M.prev, "dlm: previous suggestion", true)
  map("i", k.dismiss, M.dismiss, "dlm: dismiss suggestion", true)
  map({ "n", "i" }, k.accept_edit, function()
    return require("dlm.edit").accept(0)
  end, "dlm: apply edit prediction", true)
  vim.api.nvim_create_user_command("DlmToggle", M.toggle, { desc = "dlm: suggestions on/off" })
  vim.api.nvim_create_user_command("DlmRestart", M.restart, { desc = "dlm: restart the server" })
  vim.api.nvim_create_user_command("DlmStatus", function()
    print(M.status_text())
  end, { desc = "dlm: model and index state, latency" })
  vim.api.nvim_create_user_command("DlmLog", function()
    local f = M.log_file()
    if f then
      vim.cmd.split(vim.fn.fnameescape(f))
    else
      vim.cmd("LspLog")
    end
  end, { desc = "dlm: open the server's log" })
end

return M

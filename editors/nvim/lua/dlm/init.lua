-- dlm-lsp for Neovim: starts `dlm-lsp --stdio` through vim.lsp, shows inline
-- completions (native vim.lsp.inline_completion on 0.12+, own ghost text on
-- 0.10/0.11) and edit predictions (dlm/editPrediction) as virtual text.
local M = {}

M.defaults = {
  cmd = nil, -- full command line; nil: built from the fields below
  server_path = "dlm-lsp",
  model = nil, -- checkpoint directory (--model)
  device = nil, -- "cpu" | "cuda" | "auto"
  remote = nil, -- "HOST:PORT" of `dlm-lsp serve` (--remote)
  token_file = nil,
  tls = false,
  filetypes = nil, -- nil: every normal file buffer
  native = nil, -- nil: use vim.lsp.inline_completion when it exists (0.12+)
  debounce_ms = 30, -- own ghost text: wait this long after a keystroke
  edit_predictions = true,
  edit_prediction_delay_ms = 300,
  keymaps = { accept = "<Tab>", next = "<M-]>", dismiss = "<C-]>", accept_edit = "<M-CR>" },
}

M.config = vim.deepcopy(M.defaults)
M.enabled = true
M.status = nil -- last dlm/status notification

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

local function status_line(st)
  if not st then
    return "dlm: starting"
  end
  local s = "dlm: " .. st.state
  if st.p50_ms then
    s = s .. string.format(" p50 %d ms", math.floor(st.p50_ms + 0.5))
  end
  if st.device and st.device ~= "" then
    s = s .. " (" .. st.device .. ")"
  end
  if st.message and st.message ~= "" then
    s = s .. ": " .. st.message
  end
  return M.enabled and s or (s .. " [off]")
end

--- For a statusline: require('dlm').statusline()
function M.statusline()
  return status_line(M.status)
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
    vim.notify_once("dlm: " .. cmd[1] .. " is not executable; pip install dlm-lsp or set server_path", vim.log.levels.ERROR)
    return
  end
  vim.lsp.start({
    name = "dlm",
    cmd = cmd,
    root_dir = vim.fn.getcwd(),
    handlers = {
      ["dlm/status"] = function(_, result)
        M.status = result
        vim.api.nvim_exec_autocmds("User", { pattern = "DlmStatus", modeline = false })
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

function M.next()
  if M.use_native() then
    local ic = vim.lsp.inline_completion
    local f = ic.select or ic.jump
    if f then
      f({ count = 1 })
    end
    return true
  end
  return require("dlm.ghost").next()
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
  vim.api.nvim_set_hl(0, "DlmGhostText", { link = "Comment", default = true })
  vim.api.nvim_set_hl(0, "DlmEditPrediction", { link = "DiagnosticHint", default = true })
  vim.api.nvim_set_hl(0, "DlmEditPredictionDelete", { strikethrough = true, default = true })
  local group = vim.api.nvim_create_augroup("dlm", { clear = true })
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
  map("i", k.dismiss, M.dismiss, "dlm: dismiss suggestion", true)
  map({ "n", "i" }, k.accept_edit, function()
    return require("dlm.edit").accept(0)
  end, "dlm: apply edit prediction", true)
  vim.api.nvim_create_user_command("DlmToggle", M.toggle, { desc = "dlm: suggestions on/off" })
  vim.api.nvim_create_user_command("DlmRestart", M.restart, { desc = "dlm: restart the server" })
  vim.api.nvim_create_user_command("DlmStatus", function()
    print(M.statusline())
  end, { desc = "dlm: model state and latency" })
end

return M

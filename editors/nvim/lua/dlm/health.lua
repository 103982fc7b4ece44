-- :checkhealth dlm
local M = {}

function M.check()
  local h = vim.health
  local dlm = require("dlm")
  h.start("dlm")
  if vim.fn.has("nvim-0.10") == 1 then
    h.ok("Neovim " .. tostring(vim.version()))
  else
    h.error("Neovim 0.10 or newer is needed", { "upgrade Neovim" })
  end
  if dlm.use_native() then
    h.ok("inline completions: native vim.lsp.inline_completion")
  else
    h.ok("inline completions: dlm ghost text (Neovim < 0.12)")
  end
  local cmd = dlm.build_cmd(dlm.config)
  if vim.fn.executable(cmd[1]) == 1 then
    h.ok("server: " .. table.concat(cmd, " "))
  else
    h.error(cmd[1] .. " is not executable", { "pip install dlm-lsp", "or set server_path in require('dlm').setup{}" })
  end
  local client = dlm.client()
  if not client then
    h.warn("no dlm client is running", { "open a file, or run :DlmRestart" })
    return
  end
  local st = dlm.status
  if not st then
    h.warn("the server has not reported its status yet (model loading?)")
  elseif st.state == "ready" then
    h.ok(dlm.statusline())
  else
    h.error(dlm.statusline(), { "see :LspLog; check --model / --remote" })
  end
end

return M

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
    h.error(cmd[1] .. " is not executable", {
      "install the server from a clone of the dlm-lsp repository (it is not on PyPI): "
        .. "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .",
      "then set server_path to the full path of the venv's bin/dlm-lsp: "
        .. "require('dlm').setup({ server_path = '/path/to/dlm-lsp/.venv/bin/dlm-lsp' })",
    })
  end
  local log_file = dlm.log_file()
  if log_file then
    h.ok("server log: " .. log_file .. " (:DlmLog)")
  else
    h.info("server log: on stderr, in :LspLog (every line there reads [ERROR])")
  end
  local client = dlm.client()
  if not client then
    h.warn("no dlm client is running", { "open a file, or run :DlmRestart" })
    return
  end
  local st = dlm.status
  if not st then
    h.warn("the server has not reported its status yet (model loading?)")
  elseif st.state == "ready" and (st.offered or 0) == 0 and (st.held_back or 0) > 0 then
    -- ready, but nothing reached the editor: say why instead of an all-green report
    h.warn(dlm.model_line(st), {
      "nothing was offered: every answer was held back (" .. dlm.held_back_reason(st) .. ")",
      "low confidence: lower min_confidence in setup() to see weaker suggestions",
    })
  elseif st.state == "ready" then
    h.ok(dlm.model_line(st))
  elseif st.state == "loading" then
    h.info(dlm.model_line(st) .. " (suggestions start once it is loaded)")
  else
    h.error(dlm.model_line(st), { "see :DlmLog; check --model / --remote" })
  end
  M.check_index(st)
end

--- The workspace index (the repository memory): built, being built, failed or off, and why.
function M.check_index(st)
  local h = vim.health
  local dlm = require("dlm")
  if not st then
    return
  end
  local line = dlm.index_line(st)
  local idx = st.index
  if not line then
    h.info("index: the server did not report its workspace index (an older dlm-lsp?)")
  elseif dlm.indexing(st) then
    h.info(line .. " (suggestions come meanwhile, without the files not indexed yet)")
  elseif idx.state == "ready" and (idx.message or "") == "" then
    h.ok(line)
  elseif idx.state == "ready" then
    h.warn(line, { "the index works without what the message names; see :DlmLog" })
  elseif idx.state == "off" then
    h.warn(line, { "suggestions work without the repository memory of this workspace" })
  else
    h.error(line, { "suggestions work without the repository memory; see :DlmLog, then :DlmRestart" })
  end
end

return M

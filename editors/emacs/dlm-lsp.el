;;; dlm-lsp.el --- register dlm-lsp with lsp-mode or eglot  -*- lexical-binding: t; -*-
;; Put this file on your load-path and (require 'dlm-lsp), or copy the forms you use.
;;
;; The server is installed from a clone of the dlm-lsp repository into a
;; virtualenv (`python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .`);
;; that venv's bin/ is usually not on Emacs's `exec-path', so set
;; `dlm-lsp-server-path' to the full path of its bin/dlm-lsp:
;;
;;   (setq dlm-lsp-server-path "/home/me/src/dlm-lsp/.venv/bin/dlm-lsp")

;;; Code:

(defgroup dlm-lsp nil
  "Edit predictions from the dlm-lsp language server."
  :group 'tools
  :prefix "dlm-lsp-")

(defconst dlm-lsp--placeholder "/path/to/dlm-lsp/.venv/bin/dlm-lsp"
  "Stands in for the server's path until `dlm-lsp-server-path' is set.")

(defcustom dlm-lsp-server-path
  (or (executable-find "dlm-lsp") dlm-lsp--placeholder)
  "Full path of the dlm-lsp executable: your virtualenv's bin/dlm-lsp.
The default is the dlm-lsp found on `exec-path', else a placeholder to
replace, e.g. \"/path/to/dlm-lsp/.venv/bin/dlm-lsp\"."
  :type 'string
  :group 'dlm-lsp)

(defcustom dlm-lsp-server-args '("--stdio")
  "Arguments of the server: add \"--model\" \"DIR\", \"--device\" \"cpu\",
or \"--remote\" \"HOST:PORT\" as needed."
  :type '(repeat string)
  :group 'dlm-lsp)

(defun dlm-lsp-command ()
  "The server's command line; warns when `dlm-lsp-server-path' is not executable."
  (unless (file-executable-p dlm-lsp-server-path)
    (display-warning
     'dlm-lsp
     (format "%s is not executable: install the server from a clone of the dlm-lsp repository (python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e .) and set `dlm-lsp-server-path' to the full path of the venv's bin/dlm-lsp"
             dlm-lsp-server-path)
     :error))
  (cons dlm-lsp-server-path dlm-lsp-server-args))

;; lsp-mode: dlm runs next to your other servers (:add-on? t). lsp-mode 9.0+ has
;; lsp-inline-completion-mode, which shows textDocument/inlineCompletion as ghost text.
(with-eval-after-load 'lsp-mode
  (lsp-register-client
   (make-lsp-client
    :new-connection (lsp-stdio-connection #'dlm-lsp-command)
    :activation-fn (lsp-activate-on "python" "rust" "go" "javascript" "typescript" "c" "cpp" "java")
    :add-on? t
    :server-id 'dlm-lsp))
  (if (fboundp 'lsp-inline-completion-mode)
      (add-hook 'lsp-mode-hook #'lsp-inline-completion-mode)
    (display-warning
     'dlm-lsp
     "dlm ghost text needs lsp-mode 9.0 or newer (lsp-inline-completion-mode); this lsp-mode has no inline completions. Upgrade lsp-mode for ghost text; until then dlm's predictions still arrive through completion-at-point (company/corfu), and eglot works too."
     :warning)))

;; eglot: one server per major mode, so this replaces that mode's usual server;
;; predictions come through completion-at-point (textDocument/completion).
(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs
               `((python-mode python-ts-mode) . ,(lambda (&rest _) (dlm-lsp-command)))))

(provide 'dlm-lsp)
;;; dlm-lsp.el ends here

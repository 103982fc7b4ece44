;;; dlm-lsp.el --- register dlm-lsp with lsp-mode or eglot  -*- lexical-binding: t; -*-
;; Put this file on your load-path and (require 'dlm-lsp), or copy the form you use.

;; lsp-mode (9.0+): dlm runs next to your other servers (:add-on? t) and
;; lsp-inline-completion-mode shows its textDocument/inlineCompletion as ghost text.
(with-eval-after-load 'lsp-mode
  (lsp-register-client
   (make-lsp-client
    :new-connection (lsp-stdio-connection '("dlm-lsp" "--stdio"))
    :activation-fn (lsp-activate-on "python" "rust" "go" "javascript" "typescript" "c" "cpp" "java")
    :add-on? t
    :server-id 'dlm-lsp))
  (when (fboundp 'lsp-inline-completion-mode)
    (add-hook 'lsp-mode-hook #'lsp-inline-completion-mode)))

;; eglot: one server per major mode, so this replaces that mode's usual server;
;; predictions come through completion-at-point (textDocument/completion).
(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs
               '((python-mode python-ts-mode) . ("dlm-lsp" "--stdio"))))

(provide 'dlm-lsp)
;;; dlm-lsp.el ends here

;;; lsp-mode.el --- a stub of lsp-mode for dlm-lsp-test.el  -*- lexical-binding: t; -*-
;; Records the registered client. `lsp-inline-completion-mode' exists only when
;; `dlm-test-lsp-9' is non-nil (lsp-mode 9.0+ has it, older versions do not).
(defvar dlm-test-registered nil)
(defvar dlm-test-lsp-9 nil)
(defvar lsp-mode-hook nil)
(defun lsp-stdio-connection (command) (list :command command))
(defun lsp-activate-on (&rest languages) languages)
(defun make-lsp-client (&rest args) args)
(defun lsp-register-client (client) (setq dlm-test-registered client))
(when dlm-test-lsp-9
  (define-minor-mode lsp-inline-completion-mode "Stub." :global nil))
(provide 'lsp-mode)
;;; lsp-mode.el ends here

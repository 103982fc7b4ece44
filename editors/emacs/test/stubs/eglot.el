;;; eglot.el --- a stub of eglot for dlm-lsp-test.el  -*- lexical-binding: t; -*-
(defvar eglot-server-programs nil)
(provide 'eglot)
;;; eglot.el ends here

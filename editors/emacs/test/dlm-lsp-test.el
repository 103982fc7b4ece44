;;; dlm-lsp-test.el --- tests of dlm-lsp.el with stub lsp-mode/eglot  -*- lexical-binding: t; -*-
;; emacs --batch -Q -l ert -l editors/emacs/test/dlm-lsp-test.el -f ert-run-tests-batch-and-exit

(require 'ert)
(defconst dlm-test-dir (file-name-directory (or load-file-name buffer-file-name)))
(add-to-list 'load-path (expand-file-name ".." dlm-test-dir))
(add-to-list 'load-path (expand-file-name "stubs" dlm-test-dir))

(defun dlm-test-warnings ()
  (if (get-buffer "*Warnings*") (with-current-buffer "*Warnings*" (buffer-string)) ""))

(ert-deftest dlm-lsp-server-path-defaults-to-a-placeholder-and-warns ()
  (let ((exec-path nil))
    (load "dlm-lsp" nil t)
    (makunbound 'dlm-lsp-server-path)
    (load "dlm-lsp" nil t))  ; re-evaluate the defcustom with no dlm-lsp on exec-path
  (should (equal dlm-lsp-server-path "/path/to/dlm-lsp/.venv/bin/dlm-lsp"))
  (should (equal (dlm-lsp-command) '("/path/to/dlm-lsp/.venv/bin/dlm-lsp" "--stdio")))
  (should (string-match-p "not executable: install the server from a clone" (dlm-test-warnings)))
  (let ((dlm-lsp-server-path (executable-find "emacs")))  ; any executable
    (should (equal (car (dlm-lsp-command)) (executable-find "emacs")))))

(ert-deftest dlm-lsp-old-lsp-mode-warns-that-ghost-text-needs-9 ()
  (require 'dlm-lsp)
  (setq dlm-test-lsp-9 nil)
  (require 'lsp-mode)
  (should (eq (plist-get dlm-test-registered :server-id) 'dlm-lsp))
  (should (plist-get dlm-test-registered :add-on?))
  (should (equal (funcall (plist-get (plist-get dlm-test-registered :new-connection) :command))
                 (dlm-lsp-command)))
  (should-not (memq 'lsp-inline-completion-mode lsp-mode-hook))
  (should (string-match-p "needs lsp-mode 9.0 or newer" (dlm-test-warnings)))
  (should (string-match-p "completion-at-point" (dlm-test-warnings))))

(ert-deftest dlm-lsp-eglot-uses-the-server-path ()
  (require 'dlm-lsp)
  (require 'eglot)
  (let* ((entry (assoc '(python-mode python-ts-mode) eglot-server-programs))
         (dlm-lsp-server-path "/opt/venv/bin/dlm-lsp"))
    (should entry)
    (should (equal (funcall (cdr entry) t) '("/opt/venv/bin/dlm-lsp" "--stdio")))))

(ert-deftest dlm-lsp-lsp-mode-9-turns-on-inline-completion ()
  ;; a fresh Emacs: lsp-mode is loaded once per process
  (let* ((emacs (expand-file-name invocation-name invocation-directory))
         (out (with-temp-buffer
                (call-process emacs nil t nil "--batch" "-Q"
                              "-L" (expand-file-name ".." dlm-test-dir)
                              "-L" (expand-file-name "stubs" dlm-test-dir)
                              "--eval" "(setq dlm-test-lsp-9 t)"
                              "--eval" "(require 'dlm-lsp)" "--eval" "(require 'lsp-mode)"
                              "--eval" "(princ (format \"HOOK=%S\" lsp-mode-hook))")
                (buffer-string))))
    (should (string-match-p "HOOK=(lsp-inline-completion-mode)" out))
    (should-not (string-match-p "needs lsp-mode 9.0" out))))

;;; dlm-lsp-test.el ends here

"""dlm.lsp: the editor-facing language server. Importing it never imports torch."""

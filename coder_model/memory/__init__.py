"""Repository memory: what the user's own project says comes next (docs/architecture.md §10).

Pure Python (no torch, no file-system walking, no LSP): the workspace
service feeds files in with `RepoMemory.update_file`, the engine asks
`RepoMemory.complete` for whole-line candidates and `RepoMemory.retrieve`
for similar snippets from other files.
"""

from dlm.coder_model.memory.index import Candidate, RepoMemory
from dlm.coder_model.memory.lexer import lex
from dlm.coder_model.memory.retrieve import Snippet

__all__ = ["Candidate", "RepoMemory", "Snippet", "lex"]

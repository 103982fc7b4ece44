"""`python -m dlm.lsp.cli` with a workspace index that takes SLOW_INDEX_S seconds per file it
puts in (default 0.05): the tests that watch what dlm/status says while the index is built run
the real server through this, so that the build lasts long enough to be seen on any machine.
Only the indexer thread waits; the model, the requests and the status go on as usual."""

from __future__ import annotations

import os
import sys
import time

from dlm.lsp import workspace_index
from dlm.lsp.cli import main

DELAY_S = float(os.environ.get("SLOW_INDEX_S", "0.05"))
_put = workspace_index.WorkspaceIndex._put


def slow_put(self, ri, rel, text, sig):
    time.sleep(DELAY_S)
    return _put(self, ri, rel, text, sig)


workspace_index.WorkspaceIndex._put = slow_put

if __name__ == "__main__":
    sys.exit(main())

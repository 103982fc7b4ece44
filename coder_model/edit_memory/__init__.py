"""The edit memory (docs/architecture.md §10, docs/next-edits.md): edits -> token-level patterns -> the
sites where they still apply. A library: no lsp import, no torch."""

from dlm.coder_model.edit_memory.bursts import BurstTracker, Edit
from dlm.coder_model.edit_memory.memory import (
           EditMemory,
           Entry,
           GitMiner,
           GitStats,
           Proposal,
           mine,
           parse_log,
)
from dlm.coder_model.edit_memory.patterns import Pattern, block_pattern, extract, line_pattern
from dlm.coder_model.edit_memory.sites import Site, find_sites, key_text, rank, span_text

__all__ = ["BurstTracker", "Edit", "EditMemory", "Entry", "GitMiner", "GitStats", "Pattern", "Proposal", "Site",
           "block_pattern", "extract", "find_sites", "key_text", "line_pattern", "mine", "parse_log", "rank", "span_text"]

"""The ids of the suggestions the server gives out, and the acceptance counters kept by them.

Every inline item and edit prediction gets a fresh id (`next_id`). The client reports by id that
it showed, accepted or partly accepted one; `count` counts each event once per id and only for
ids this server issued, so a client bug cannot inflate the counters (lsp.stats). The newest
MAX_REMEMBERED_ITEMS ids are kept.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from typing import Any

from dlm.lsp.stats import Stats

log = logging.getLogger(__name__)

MAX_REMEMBERED_ITEMS = 256


class SuggestionIds:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.issued: OrderedDict[str, set[str]] = OrderedDict()  # id -> the events counted for it, newest last
        self._ids = itertools.count(1)

    def next_id(self) -> str:
        """A fresh id for a suggestion the client may show and accept (remembered: `count`)."""
        item_id = str(next(self._ids))
        self.issued[item_id] = set()
        while len(self.issued) > MAX_REMEMBERED_ITEMS:
            self.issued.popitem(last=False)
        return item_id

    def count(self, event: str, item_id: Any) -> bool:
        """Count `event` (shown, accepted, partially_accepted) for a suggestion id, when this
        server issued the id and the event was not counted for it yet; else log and ignore."""
        key = str(item_id) if isinstance(item_id, (str, int)) and not isinstance(item_id, bool) else None
        seen = self.issued.get(key) if key is not None else None
        if seen is None:
            log.debug("%s for an id this server did not issue (%.40r); not counted", event, item_id)
            return False
        if event in seen:
            return False
        seen.add(event)
        self.stats.add(event)
        return True

"""The Responses API's in-memory store: finished responses by id, for GET / DELETE and for
`previous_response_id` to continue a conversation. Bounded by count and age; lost on restart.

Each entry keeps its own turn (the request's input items and the response's output items) and a
reference to the entry it continued, so a long conversation is held once, not once per turn, and
an evicted or deleted ancestor still reaches its descendants' history.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

MAX_RESPONSES = 1000  # stored responses; the oldest goes first
MAX_AGE_S = 3600.0  # a response older than this is forgotten


@dataclass(frozen=True, eq=False)
class StoredResponse:
    response: dict  # the Response object as the API returned it
    items: tuple  # this turn: the input items, then the output items
    parent: StoredResponse | None
    stored_at: float

    def conversation(self) -> list[dict]:
        """Every item of the conversation up to and including this response, oldest first."""
        turns, e = [], self
        while e is not None:
            turns.append(e.items)
            e = e.parent
        return [item for turn in reversed(turns) for item in turn]


class ResponseStore:
    """Responses by id, at most `max_responses` of them, each for at most `max_age_s` seconds.
    Used from the event loop only (no locking)."""

    def __init__(self, max_responses: int = MAX_RESPONSES, max_age_s: float = MAX_AGE_S,
                 clock=time.monotonic):
        if max_responses < 1 or max_age_s <= 0:
            raise ValueError("the response store needs max_responses >= 1 and max_age_s > 0")
        self.max_responses = max_responses
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response: dict, items: list[dict], parent: StoredResponse | None) -> StoredResponse:
        self._expire()
        entry = StoredResponse(response, tuple(items), parent, self._clock())
        self._entries[response["id"]] = entry
        while len(self._entries) > self.max_responses:
            self._entries.popitem(last=False)
        return entry

    def get(self, response_id: str) -> StoredResponse | None:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._entries.pop(response_id, None) is not None

    def _expire(self) -> None:
        cutoff = self._clock() - self.max_age_s
        while self._entries:
            first = next(iter(self._entries.values()))
            if first.stored_at > cutoff:
                break
            self._entries.popitem(last=False)


def response_store(app) -> ResponseStore:
    """The app's store, made on first use (one per app: in-process test apps do not share it)."""
    store = getattr(app.state, "responses_store", None)
    if store is None:
        store = app.state.responses_store = ResponseStore()
    return store

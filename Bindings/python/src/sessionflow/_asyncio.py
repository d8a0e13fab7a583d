"""The asyncio bridge: the library's callbacks (on its loop thread) handed to an asyncio event
loop with loop.call_soon_threadsafe, into an asyncio.Queue that an async iterator reads.

    async for state in runtime.states(): ...        # conflated, as the C StateFlow
    async for event in runtime.events(): ...        # every event, in order
    async for status, reason in runtime.store_statuses(): ...   # conflated
    token = await runtime.fresh_token_async()

The subscription is made when states()/events()/store_statuses() is called (so nothing
emitted after that call is missed: call it inside the coroutine, on the event loop's thread)
and closed when the iteration stops: the flow ends (the runtime was destroyed:
StopAsyncIteration), a `break` (the iterator is dropped: closed at once by CPython's reference
counting, or use `async with runtime.states() as states:` to close it at a known point), the
task is cancelled while it waits (an __anext__ that is cancelled ends the iteration), aclose(),
or garbage collection.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Optional, Tuple, TypeVar, Union

from . import _ffi
from ._callbacks import Entry, ErrorSink
from ._types import Event, State, StoreStatus, Subscription
from .errors import SessionFlowError

T = TypeVar("T")

_VALUE, _END, _ERROR = 0, 1, 2
_Item = Tuple[int, Any]


class Channel:
    """From the loop thread to one asyncio event loop. `conflate`: only the latest value waits
    (a slow reader skips intermediate values but always ends on the latest)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, conflate: bool) -> None:
        self.loop = loop
        self.conflate = conflate
        self.queue: "asyncio.Queue[_Item]" = asyncio.Queue()

    def post(self, item: _Item) -> None:
        """Any thread."""
        try:
            self.loop.call_soon_threadsafe(self._put, item)
        except RuntimeError:
            pass  # the event loop is closed: no one reads any more

    def _put(self, item: _Item) -> None:
        """On the event loop."""
        if self.conflate and item[0] == _VALUE:
            while not self.queue.empty():  # only values can be there: an end is the last item
                self.queue.get_nowait()
        self.queue.put_nowait(item)


class _Push(Entry):
    """A subscription whose callbacks post to a Channel."""

    def __init__(self, sink: ErrorSink, where: str, channel: Channel) -> None:
        super().__init__(sink, where)
        self.channel = channel

    def on_error(self, code: int, message: Optional[bytes]) -> None:
        error = SessionFlowError.from_code(code, f"{self.where} (on_error)", _ffi.text(message) or None)
        self.channel.post((_ERROR, error))

    def on_complete(self) -> None:
        self.channel.post((_END, None))


class StatePush(_Push):
    def on_state(self, state: int) -> None:
        self.channel.post((_VALUE, State(state)))


class EventPush(_Push):
    def on_event(self, raw: Any) -> None:
        self.channel.post((_VALUE, Event._from_raw(raw.contents)))


class StatusPush(_Push):
    def on_status(self, status: int, reason: Optional[bytes]) -> None:
        self.channel.post((_VALUE, (StoreStatus(status), _ffi.text(reason))))


class FlowIterator(AsyncIterator[T]):
    """An async iterator over one subscription (see the module's documentation)."""

    def __init__(self, subscription: Subscription, channel: Channel, sink: ErrorSink, distinct: bool) -> None:
        self._subscription = subscription
        self._channel = channel
        self._sink = sink
        self._distinct = distinct
        self._last: Union[T, object] = _NOTHING
        self._closed = False

    @property
    def subscription(self) -> Subscription:
        return self._subscription

    def __aiter__(self) -> "FlowIterator[T]":
        return self

    async def __anext__(self) -> T:
        while True:
            if self._closed:
                raise StopAsyncIteration
            try:
                self._sink.raise_pending()  # a callback's exception: raised from the next call
            except BaseException:
                self.close()
                raise
            try:
                kind, value = await self._channel.queue.get()
            except BaseException:  # cancelled (or the loop is going away): the iteration ends
                self.close()
                raise
            if kind == _END:
                self.close()
                raise StopAsyncIteration
            if kind == _ERROR:
                self.close()
                raise value
            # Conflation may bring back the value last returned (A, then B and A again while
            # the reader was away): the flow never shows the same value twice in a row.
            if self._distinct and value == self._last:
                continue
            self._last = value
            result: T = value
            return result

    def close(self) -> None:
        """Closes the subscription (from any thread, any number of times)."""
        if not self._closed:
            self._closed = True
            self._subscription.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> "FlowIterator[T]":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


_NOTHING = object()


def running_loop(call: str) -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(f"Runtime.{call}() needs a running asyncio event loop: call it in a coroutine") from None


class AsyncTokenEntry(Entry):
    """One sf_session_fresh_token answer, resolved on the event loop."""

    def __init__(self, sink: ErrorSink, loop: asyncio.AbstractEventLoop, future: "asyncio.Future[str]") -> None:
        super().__init__(sink, "fresh_token_async")
        self.loop = loop
        self.future = future

    def on_token(self, result: int, token: Optional[bytes], detail: Optional[str] = None) -> None:
        value = _ffi.text(token)  # borrowed: copied now, on the loop thread
        try:
            self.loop.call_soon_threadsafe(self._resolve, result, value, detail)
        except RuntimeError:
            pass  # the event loop is closed: no one awaits it

    def _resolve(self, result: int, token: str, detail: Optional[str] = None) -> None:
        if self.future.done():  # the awaiting task was cancelled
            return
        if result < 0:
            self.future.set_exception(SessionFlowError.from_code(result, "sf_session_fresh_token (answer)", detail))
        else:
            self.future.set_result(token)

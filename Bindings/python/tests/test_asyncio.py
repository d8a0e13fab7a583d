"""The asyncio bridge: async iteration over states, events and store statuses, and an
awaitable token. Plain asyncio.run (no pytest-asyncio)."""
import asyncio
import gc
import threading

import pytest

import sessionflow as sf
from sessionflow import _callbacks
from sessionflow._asyncio import _VALUE, Channel, FlowIterator
from helpers import wait_for

State = sf.State


async def until(condition, timeout=10.0):
    """Waits on the event loop until `condition()` holds (the loop thread's callbacks reached
    it); `timeout` is a hang guard, not a pause the test relies on."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.002)


def test_states_gives_the_current_state_then_changes_on_the_event_loop_thread():
    async def main():
        with sf.Runtime() as rt:
            seen, threads = [], []
            states = rt.states()
            async for state in states:
                seen.append(state)
                threads.append(threading.get_ident())
                if state == State.LOGGED_OUT and len(seen) == 1:
                    await asyncio.to_thread(rt.sign_in, "access-1", "refresh-1", 3600)
                elif state == State.LOGGED_IN:
                    break
            return seen, threads

    seen, threads = asyncio.run(main())
    assert seen == [State.LOGGED_OUT, State.LOGGED_IN]
    assert set(threads) == {threading.get_ident()}  # the event loop's thread, not the library's


def test_a_slow_consumer_skips_intermediate_states_and_ends_on_the_latest():
    async def main():
        with sf.Runtime() as rt:
            async with rt.states() as states:
                rt.sign_in("access-1", "refresh-1", 3600)  # blocking calls: the consumer is away
                rt.logout()
                rt.sign_in("access-2", "refresh-2", 3600)
                # A round trip through the runtime's loop: the state deliveries queued before it
                # have posted to the event loop, and their posts ran before this answer's.
                await rt.fresh_token_async()
                first = await states.__anext__()
                assert states._channel.queue.empty()  # nothing older waits behind it
                rt.logout()
                second = await states.__anext__()
                return first, second

    assert asyncio.run(main()) == (State.LOGGED_IN, State.LOGGED_OUT)


def test_conflation_never_gives_the_same_state_twice_in_a_row():
    """Driven through the channel directly, as the loop thread would: A read, then B and A
    arrive while the reader is away (conflated to A): the reader waits for a new value."""
    closed = []

    class FakeSubscription:
        def close(self):
            closed.append(1)
            return True

    async def main():
        channel = Channel(asyncio.get_running_loop(), conflate=True)
        states = FlowIterator(FakeSubscription(), channel, _callbacks.ErrorSink(None), distinct=True)
        channel.post((_VALUE, State.LOGGED_OUT))
        first = await states.__anext__()
        channel._put((_VALUE, State.LOGGED_IN))
        channel._put((_VALUE, State.LOGGED_OUT))  # conflated: only LOGGED_OUT waits
        assert channel.queue.qsize() == 1
        pending = asyncio.ensure_future(states.__anext__())
        await asyncio.sleep(0.05)
        assert not pending.done()  # LOGGED_OUT again is not shown
        threading.Thread(target=channel.post, args=((_VALUE, State.LOGGED_IN),)).start()
        second = await asyncio.wait_for(pending, 5)
        await states.aclose()
        return first, second

    assert asyncio.run(main()) == (State.LOGGED_OUT, State.LOGGED_IN)
    assert closed == [1]


def test_events_arrive_in_order_and_end_when_the_runtime_is_destroyed():
    async def main():
        rt = sf.Runtime()
        kinds = []

        async def consume():
            async for event in events:
                kinds.append(event.kind)

        events = rt.events()
        task = asyncio.ensure_future(consume())
        rt.sign_in("access-1", "refresh-1", 3600, "m-1")
        rt.logout()
        await until(lambda: len([k for k in kinds if k != sf.EventKind.INITIAL_SESSION]) == 2)
        rt.destroy()  # completes the subscription: the iteration ends
        await asyncio.wait_for(task, 5)
        return [k for k in kinds if k != sf.EventKind.INITIAL_SESSION], events

    kinds, events = asyncio.run(main())
    assert kinds == [sf.EventKind.SIGNED_IN, sf.EventKind.SIGNED_OUT]
    assert events.subscription.close() is False  # completed


def test_store_statuses_gives_the_current_status_first():
    async def main():
        with sf.Runtime() as rt:
            async with rt.store_statuses() as statuses:
                return await statuses.__anext__()

    assert asyncio.run(main()) == (sf.StoreStatus.AVAILABLE, "")


def test_break_closes_the_subscription():
    async def main():
        with sf.Runtime() as rt:
            before = _callbacks.kept()
            async for state in rt.states():  # the iterator is dropped at the break
                break
            assert wait_for(lambda: _callbacks.kept() == before)  # released: closed
            async with rt.states() as states:
                async for state in states:
                    break
            assert states.subscription.close() is False  # closed by the block's end
            return state

    assert asyncio.run(main()) == State.LOGGED_OUT


def test_cancellation_closes_the_subscription():
    async def main():
        with sf.Runtime() as rt:
            holder, first = [], asyncio.Event()

            async def consume():
                holder.append(rt.states())
                async for state in holder[0]:
                    first.set()

            task = asyncio.ensure_future(consume())
            await asyncio.wait_for(first.wait(), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # closed on cancellation, with the runtime still alive and the iterator referenced
            return holder[0].subscription.close()

    assert asyncio.run(main()) is False


def test_garbage_collection_closes_the_subscription():
    async def main():
        with sf.Runtime() as rt:
            states = rt.states()
            subscription = states.subscription
            del states
            gc.collect()
            return subscription.close()

    assert asyncio.run(main()) is False


def test_the_bridge_needs_a_running_event_loop():
    with sf.Runtime() as rt:
        before = _callbacks.kept()
        with pytest.raises(RuntimeError, match="running asyncio event loop"):
            rt.states()
        assert _callbacks.kept() == before  # nothing subscribed


def test_fresh_token_async_awaits_one_shared_refresh():
    requests = []

    def refresher(request, refresh_token):
        requests.append(refresh_token)
        threading.Timer(0.05, lambda: request.succeed("access-2", "refresh-2", 3600)).start()

    async def main():
        with sf.Runtime(refresher=refresher) as rt:
            rt.sign_in("access-1", "refresh-1", 0)
            return await asyncio.gather(*(rt.fresh_token_async() for _ in range(5)))

    assert asyncio.run(main()) == ["access-2"] * 5
    assert requests == ["refresh-1"]


def test_fresh_token_async_raises_the_librarys_answer():
    async def main():
        with sf.Runtime() as rt:
            await rt.fresh_token_async()

    with pytest.raises(sf.NotLoggedInError) as error:
        asyncio.run(main())
    assert error.value.name == "SF_ENOTLOGGEDIN"


def test_a_pending_callback_exception_ends_an_async_iteration():
    async def main():
        with sf.Runtime() as rt:
            rt.subscribe_events(lambda event: 1 / 0 if event.kind == sf.EventKind.SIGNED_IN else None)
            states = rt.states()
            assert await states.__anext__() == State.LOGGED_OUT
            rt.sign_in("access-1", "refresh-1", 3600)  # its SIGNED_IN event raises in the callback
            await until(lambda: rt._sink._pending is not None)
            with pytest.raises(sf.CallbackError):
                await states.__anext__()
            assert states.subscription.close() is False

    asyncio.run(main())

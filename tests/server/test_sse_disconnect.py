"""SSEResponse stops streaming when its client disconnects, even when a cancel is swallowed
(Python 3.11's asyncio.wait_for can lose one that lands as the send it waits on completes)."""

import asyncio

from edged.server.responses import SSEResponse


def test_disconnect_stops_a_sender_that_swallowed_one_cancel():
    sent, closed = [], []

    async def events():
        i = 0
        swallowed = False
        while True:
            try:
                await asyncio.sleep(0.001)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed = True  # the lost cancel: streaming goes on to a gone client
            i += 1
            yield b"data: %d\n\n" % i

    async def send(msg):
        sent.append(msg)

    async def main():
        gone = asyncio.Event()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        async def disconnect_soon():
            while len(sent) < 20:
                await asyncio.sleep(0.001)
            gone.set()

        dis = asyncio.ensure_future(disconnect_soon())
        await asyncio.wait_for(SSEResponse(events(), lambda: closed.append(len(sent)))({}, receive, send), 10)
        await dis
        return len(sent)

    n = asyncio.run(main())
    assert closed == [n]  # on_close ran once, after the last send
    assert n < 1000  # stopped within ~10 ms of sends (before the fix it streamed until the 10 s timeout)

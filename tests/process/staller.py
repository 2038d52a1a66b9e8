"""Stalled HTTP clients in their own process: the attack on a status page.

Usage: python staller.py PORT ADDRESSES PER_ADDRESS

Holds ADDRESSES x PER_ADDRESS connections to 127.0.0.1:PORT, each bound to its own source
address 127.0.0.2, 127.0.0.3, ... (Linux routes all of 127/8 to lo). Each sends the start of
a request head, then one more header byte every 0.2 s, never the head's end; the moment the
server closes it, it reconnects. Prints ``ready`` once every connection was opened once;
when its stdin closes, prints one JSON line: connections opened, and the longest a connection
was held open by the server (seconds), and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pccl_aio as pccl

TRICKLE = 0.2  # seconds between two bytes of a head that never ends


async def stall(port: int, source: str, stats: dict[str, float],
                opened: asyncio.Event | None, stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(source, 0))
        except OSError:
            stats["refused"] += 1
            await asyncio.sleep(0.01)  # the listen queue overflowed: try again
            continue
        t0 = loop.time()
        stats["opened"] += 1
        if opened is not None:
            opened.set()
            opened = None
        writer.write(b"GET / HTTP/1.1\r\nX-Stall: ")
        try:
            while not stop.is_set():
                try:  # the next byte at the client's pace, unless the server closed it
                    async with asyncio.timeout(TRICKLE):
                        if not await reader.read(1):
                            break
                except TimeoutError:
                    writer.write(b"a")
        except (ConnectionError, OSError):
            pass
        stats["longest"] = max(stats["longest"], loop.time() - t0)
        writer.close()


async def main() -> None:
    port, addresses, per_address = (int(a) for a in sys.argv[1:4])
    stats = {"opened": 0.0, "refused": 0.0, "longest": 0.0}
    loop = asyncio.get_running_loop()
    firsts = [asyncio.Event() for _ in range(addresses * per_address)]
    stop = asyncio.Event()
    tasks = [asyncio.ensure_future(stall(port, f"127.0.0.{2 + i // per_address}", stats, ev,
                                         stop)) for i, ev in enumerate(firsts)]
    await asyncio.gather(*(ev.wait() for ev in firsts))
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the test closes it
    stop.set()
    await asyncio.gather(*tasks)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    pccl.run(main())

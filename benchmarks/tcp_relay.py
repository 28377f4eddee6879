"""The floor any proxy pays here: a byte relay with no HTTP at all, one upstream connection per client.

    python benchmarks/tcp_relay.py LISTEN_PORT UPSTREAM_PORT

``benchmarks/overhead.py`` measures it beside the gateway: what it adds is the extra network hop and
process wake-ups; the gateway's ``x-enginegate-overhead-ms`` should account for the rest.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def main(listen: int, upstream: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))

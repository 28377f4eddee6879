"""Library functions the request path calls per request or per streamed event, as names compiled code
reads for nothing.

Compiled by mypyc, ``time.perf_counter()`` is a look-up of the attribute on the module object at every
call (about 250 instructions under callgrind: the module's type, then its dictionary), and a name
imported with ``from time import perf_counter`` a look-up in the importing module's dictionary (about
130). A module-level ``Final`` name is a C static instead, which compiled code reads directly, in this
module's callers too (mypyc compiles them into one extension). Interpreted, each is an ordinary global.
A whole answer made about 35 such look-ups and a 16-token stream about 70.

Not a name, but the same kind of cost: a test for one byte in bytes is written with the byte's int
(``0 in data``, not ``b"\\x00" in data``). Given bytes, ``in`` first tries them as an int and makes,
formats and clears a ``TypeError`` (about 2,000 instructions a test under callgrind); an int goes
straight to ``memchr``. Longer bytes are looked for with ``find`` where it runs per request (a call of
about 1,000 instructions); per event, where a split is one call for a read, a ``find`` for each event costs
more than that split.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import orjson

perf_counter: Final = time.perf_counter
wall_time: Final = time.time
json_dumps: Final = orjson.dumps
json_loads: Final = orjson.loads
current_task: Final = asyncio.current_task
running_loop: Final = asyncio.get_running_loop

"""Step 4 of routing: sending bytes to a node.

One aiohttp ClientSession with a tuned TCPConnector per app keeps pooled keep-alive
connections to every node; `inproc://name` URLs call the node's handler in this process
(no HTTP hop). Bodies go out and come back as raw bytes: nothing is decoded here.
"""

from __future__ import annotations

import asyncio

import aiohttp

from chainstate.inproc import InprocRegistry, is_inproc

_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


class UpstreamError(Exception):
    """An attempt that got no usable answer: `kind` is connect, timeout, http or inproc."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class Upstream:
    def __init__(
        self,
        registry: InprocRegistry | None,
        connections: int = 512,
        keepalive: float = 30.0,
    ) -> None:
        self.registry = registry
        self._connections = connections
        self._keepalive = keepalive
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._connections,
            limit_per_host=0,
            keepalive_timeout=self._keepalive,
            ttl_dns_cache=300,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=_HEADERS,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent",),
            auto_decompress=True,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        t = self._timeouts.get(seconds)
        if t is None:
            t = self._timeouts[seconds] = aiohttp.ClientTimeout(total=seconds)
        return t

    async def send(self, url: str, body: bytes, limit: float) -> bytes:
        """The raw response body (b"" for a 204). Raises UpstreamError."""
        if is_inproc(url):
            return await self._send_inproc(url, body, limit)
        session = self._session
        if session is None:
            raise UpstreamError("connect", "upstream session is closed")
        try:
            async with session.post(url, data=body, timeout=self._timeout(limit)) as resp:
                data = await resp.read()
                status = resp.status
        except TimeoutError:
            raise UpstreamError("timeout", f"no answer from {url} within {limit}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("connect", f"{url}: {type(exc).__name__}: {exc}") from None
        if status == 200 or status == 204:
            return data
        raise UpstreamError("http", f"{url} answered HTTP {status}")

    async def _send_inproc(self, url: str, body: bytes, limit: float) -> bytes:
        handler = self.registry.resolve(url) if self.registry is not None else None
        if handler is None:
            raise UpstreamError("connect", f"{url}: no such in-process node")
        try:
            return await asyncio.wait_for(handler(body), limit)
        except TimeoutError:
            raise UpstreamError("timeout", f"no answer from {url} within {limit}s") from None
        except Exception as exc:  # a failing in-process node is an unusable answer
            raise UpstreamError("inproc", f"{url}: {type(exc).__name__}: {exc}") from None

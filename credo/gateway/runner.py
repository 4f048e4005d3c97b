"""`Gateway`: the endpoint served by uvicorn in a background thread, with its key and its episode store."""

from __future__ import annotations

import secrets
import threading
import time

from credo.gateway.backend import SampleFn
from credo.gateway.capture import EpisodeStore
from credo.gateway.server import ChatService, build_app


class Gateway:
    """Serve `sample` as an OpenAI-compatible endpoint on `host:port` (port 0 = a free one) until `stop()`.

        with Gateway(sample, tokenizer, model_name="policy") as gw:
            client = openai.OpenAI(base_url=gw.base_url, api_key=gw.episode_key("ep-0"))
            ...
            gw.store.trajectories("ep-0")   # list[Sample]: mask 1 = sampled tokens
    """

    def __init__(self, sample: SampleFn, tokenizer, *, model_name: str, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, max_tokens: int = 256, max_context: int | None = None,
                 sampling: dict | None = None, batch_window_s: float = 0.0, max_batch: int = 64,
                 chat_template: str | None = None):
        self.api_key = api_key or "credo-" + secrets.token_urlsafe(24)
        if ":" in self.api_key:
            raise ValueError("the gateway's api_key must not contain ':' (it separates the episode id)")
        self.store = EpisodeStore(tokenizer)
        if batch_window_s > 0:  # concurrent agents' calls sampled together (credo.gateway.batching)
            from credo.gateway.batching import BatchingSampler

            sample = BatchingSampler(sample, batch_window_s, max_batch)
        self.service = ChatService(sample, tokenizer, model_name=model_name, store=self.store, max_tokens=max_tokens,
                                   max_context=max_context, sampling=sampling,
                                   concurrent=batch_window_s > 0, template=chat_template)
        self.app = build_app(self.service, self.api_key)
        self.host, self.port = host, port
        self._server = self._thread = None

    def episode_key(self, episode: str) -> str:
        """The API key that names `episode` (for agents that can only set base_url and api_key)."""
        return f"{self.api_key}:{episode}"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> "Gateway":
        import uvicorn

        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="credo-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port} within {timeout} s")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

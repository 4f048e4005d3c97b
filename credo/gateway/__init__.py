"""An OpenAI-compatible gateway that records exact tokens (docs/gateway.md).

- `credo.gateway.chat`: request checks, the chat template, tool-call parsing, stop strings;
- `credo.gateway.capture`: per-episode token capture, trajectory assembly and the retokenization-drift rule;
- `credo.gateway.backend`: the one sampling function the gateway calls (swappable for the generation service);
- `credo.gateway.server`: the FastAPI app (`/v1/chat/completions`, `/v1/models`), the key and episode ids;
- `credo.gateway.runner`: `Gateway`, the app served by uvicorn in a thread on 127.0.0.1;
- `credo.gateway.rewards`: an episode's reward in the fields credo's multi-turn credit reads;
- `credo.gateway.agents`: the agent contract: `run_episodes` calls an agent function once per task, isolated;
- `credo.gateway.batching`: concurrent agents' calls sampled in one generate call (opt-in);
- `credo.gateway.examples`: agents trained through the gateway (recipes/gateway_gem.yaml, recipes/gateway_shop.yaml).

Training through it is the agent family's (`rollout.agent`, credo/families/agent/).

Importing this package loads none of FastAPI, uvicorn or torch-heavy parts until they are used.
"""

from __future__ import annotations


def __getattr__(name: str):
    if name == "Gateway":
        from credo.gateway.runner import Gateway

        return Gateway
    if name == "backend_sampler":
        from credo.gateway.backend import backend_sampler

        return backend_sampler
    raise AttributeError(f"module 'credo.gateway' has no attribute {name!r}")


__all__ = ["Gateway", "backend_sampler"]

"""Example agents trained through the gateway (docs/gateway.md): plain programs on the `openai` client, which credo
calls once per episode with `base_url`, `api_key`, `model` and `task`. Importable as
`credo.gateway.examples.<module>:run_episode`, so a recipe can name them wherever credo runs."""

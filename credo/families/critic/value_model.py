"""Value models (critics): a causal LM's backbone with a scalar head on the last hidden state.

Value convention (verl's): column j of the [B, L-1] output is V of the state after tokens 0..j, the
state from which token j+1 is generated, so values are label-aligned like log-probs: the value at the
column of a response token is the value of the state that chose it.
"""

from __future__ import annotations

import torch
from torch import nn

from credo.config import ConfigError


class ValueModel(nn.Module):
    """Backbone of a causal LM (its `base_model_prefix` module, no LM head) + `nn.Linear(hidden, 1)`.

    The head is initialised N(0, init_std^2) with a zero bias from its own generator (`head_seed`), so
    building a critic leaves the global RNG untouched and mini-critics built from one model differ.
    """

    def __init__(self, causal_lm: nn.Module, *, head_seed: int, init_std: float = 0.02):
        super().__init__()
        self.base_model_prefix = causal_lm.base_model_prefix
        setattr(self, self.base_model_prefix, getattr(causal_lm, causal_lm.base_model_prefix))
        self.config = causal_lm.config
        hidden = causal_lm.config.hidden_size
        dtype = next(causal_lm.parameters()).dtype
        with torch.random.fork_rng(devices=[]):  # nn.Linear's default init draws from the global RNG
            self.value_head = nn.Linear(hidden, 1, dtype=dtype)
        g = torch.Generator().manual_seed(head_seed)
        with torch.no_grad():
            self.value_head.weight.copy_(torch.randn(1, hidden, generator=g) * init_std)
            self.value_head.bias.zero_()

    @property
    def backbone(self) -> nn.Module:
        return getattr(self, self.base_model_prefix)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Values of every state but the last.

        Args:
            input_ids: [B, L] long. attention_mask: [B, L].
        Returns:
            [B, L-1] float32: column j is V(state after tokens 0..j) (label-aligned like log-probs).
        """
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
        return self.value_head(hidden).squeeze(-1).float()


def load_value_model(path: str, *, dtype: str, head_seed: int, actor_tokenizer, actor_path: str) -> ValueModel:
    """A critic from a Hugging Face causal-LM folder (or hub id), checked against the actor's tokenizer.

    Raises:
        ConfigError: the critic's tokenizer or vocabulary differs from the actor's (naming both paths).
    """
    from credo.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer(path)
    if tok.get_vocab() != actor_tokenizer.get_vocab():
        raise ConfigError(f"critic tokenizer mismatch: critic '{path}' has a vocabulary of {len(tok)} tokens that "
                          f"differs from the actor '{actor_path}' ({len(actor_tokenizer)} tokens); expected the same "
                          "tokenizer (critics read the actor's token ids)")
    lm = load_causal_lm(path, dtype)
    rows = lm.get_input_embeddings().weight.shape[0]
    if rows < len(actor_tokenizer):
        raise ConfigError(f"critic vocabulary mismatch: critic '{path}' embeds {rows} tokens but the actor "
                          f"'{actor_path}' tokenizer has {len(actor_tokenizer)}; expected at least as many rows")
    return ValueModel(lm, head_seed=head_seed, init_std=getattr(lm.config, "initializer_range", 0.02))

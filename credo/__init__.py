"""credo: reinforcement-learning losses and credit assignment for LLM post-training.

`credo.algos` and `credo.credit` are pure torch; importing `credo` itself pulls in nothing heavy.
"""

__version__ = "0.1.0"

from credo import _moved

_moved.install()  # old import paths (credo.envs, credo.train.critic, ...) keep working for one release

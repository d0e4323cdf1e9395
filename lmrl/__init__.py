"""lmrl: reinforcement learning for language models, end to end."""

__version__ = "0.1.0"

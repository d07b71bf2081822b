"""Quest: the selector (selector.py) and its fused Triton page-bound kernels (kernels.py, imported only when the
selector runs with backend triton). docs/methods/quest.md."""
from baselines.quest.selector import QuestSelector

__all__ = ["QuestSelector"]

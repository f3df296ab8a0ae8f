"""`remat.checkpointing`: the DeepSpeed-compatible module. It lives in remat.eager.checkpointing; this name is the
same module object, so `import remat.checkpointing` and `from remat import checkpointing` share its settings."""

import sys

from .eager import checkpointing as _module

sys.modules[__name__] = _module

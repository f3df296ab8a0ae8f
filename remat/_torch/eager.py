"""torch internals remat's eager checkpoint wrappers read: wrap-policy objects and batch norm's base class."""

from __future__ import annotations

from typing import Any

from .guard import TorchAPIError, lookup


def wrap_policy_targets(policy: Any, root: Any) -> dict | None:
    """The submodules of `root` a torch wrap-policy object (`ModuleWrapPolicy`, `CustomPolicy`: subclasses of
    torch.distributed.fsdp.wrap._Policy) selects, each with the keyword arguments for its wrapper; None when `policy`
    is not such an object."""
    try:
        base = lookup("torch.distributed.fsdp.wrap", "_Policy")
    except TorchAPIError:
        return None  # torch without torch.distributed: no policy object can exist
    if not isinstance(policy, base):
        return None
    return policy._run_policy(root, ignored_modules=set(), root_kwargs={})


# The base class of BatchNorm1d/2d/3d, their lazy forms and SyncBatchNorm: the modules with running statistics.
BatchNormBase: type = lookup("torch.nn.modules.batchnorm", "_BatchNorm")

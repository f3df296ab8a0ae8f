"""torch's call form of `apply_activation_checkpointing`: pick submodules by `check_fn` or an FSDP-style
`auto_wrap_policy` and replace each by `checkpoint_wrapper_fn(submodule)`, as
torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing does.

The walk is torch's: post-order (a module's children are wrapped before the module itself is considered), the root
is never wrapped. A policy callable is asked `policy(module=m, recurse=True, nonwrapped_numel=n)` whether to descend
into `m` and `policy(module=m, recurse=False, nonwrapped_numel=n)` whether to wrap it, `n` being the parameters of
`m` not inside an already wrapped submodule; a policy object (`ModuleWrapPolicy`, `CustomPolicy`) names its modules
and their wrapper keyword arguments.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from .. import _torch


def apply(
    model: nn.Module,
    wrapper_fn: Callable[..., nn.Module],
    check_fn: Callable[[nn.Module], bool] | None,
    auto_wrap_policy: Any,
) -> nn.Module:
    """Wrap `model`'s submodules in place; returns `model`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"apply_activation_checkpointing(model={model!r}): expected an nn.Module")
    if not callable(wrapper_fn):
        raise TypeError(
            f"checkpoint_wrapper_fn={wrapper_fn!r}: expected a callable that wraps a module, such as "
            "remat.checkpoint_wrapper"
        )
    if auto_wrap_policy is None:
        if check_fn is None:
            check_fn = _every_module
        if not callable(check_fn):
            raise TypeError(
                f"check_fn={check_fn!r}: expected a callable taking a module and returning True to "
                "checkpoint it, e.g. lambda m: isinstance(m, Block)"
            )
        _wrap_children(model, _check_policy(check_fn), wrapper_fn, root=True)
        return model
    targets = _torch.wrap_policy_targets(auto_wrap_policy, model)
    if targets is not None:
        _post_order(model, lambda m: wrapper_fn(m, **targets[m]) if m in targets and m is not model else None)
    elif callable(auto_wrap_policy):
        _wrap_children(model, auto_wrap_policy, wrapper_fn, root=True)
    else:
        raise TypeError(
            f"auto_wrap_policy={auto_wrap_policy!r}: expected a callable policy(module, recurse, "
            "nonwrapped_numel) or a torch wrap-policy object such as ModuleWrapPolicy({Block})"
        )
    return model


def _every_module(_module: nn.Module) -> bool:
    return True


def _check_policy(check_fn: Callable[[nn.Module], bool]) -> Callable[..., bool]:
    def policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return True if recurse else bool(check_fn(module))

    return policy


def _wrap_children(
    module: nn.Module, policy: Callable[..., bool], wrapper_fn: Callable[..., nn.Module], root: bool = False
) -> tuple[nn.Module, int]:
    """`module`, wrapped if the policy says so (never the root), and the parameter count now inside wrappers."""
    numel = sum(p.numel() for p in module.parameters())
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return module, 0
    wrapped = 0
    for name, child in list(module.named_children()):
        new, count = _wrap_children(child, policy, wrapper_fn)
        if new is not child:
            setattr(module, name, new)
        wrapped += count
    if not root and policy(module=module, recurse=False, nonwrapped_numel=numel - wrapped):
        return wrapper_fn(module), numel
    return module, wrapped


def _post_order(root: nn.Module, fn: Callable[[nn.Module], nn.Module | None]) -> None:
    """Replace each module `fn` returns a module for, children first, each shared module visited once."""
    visited = {root}

    def visit(module: nn.Module) -> None:
        for name, child in list(module.named_children()):
            if child in visited:
                continue
            visited.add(child)
            visit(child)
            new = fn(child)
            if new is not None and new is not child:
                setattr(module, name, new)

    visit(root)

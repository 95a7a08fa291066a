"""Grad mode: whether dispatch records autograd nodes.

>>> import tessera
>>> with tessera.no_grad():
...     y = tessera.ones(2, requires_grad=True) * 2
>>> y.requires_grad
False
"""
from __future__ import annotations

import functools


class _State:
    enabled = True
    inference = False


STATE = _State()


def is_grad_enabled() -> bool:
    return STATE.enabled


def is_inference_mode_enabled() -> bool:
    return STATE.inference


class _Mode:
    """Base of the grad-mode context managers; each also works as a decorator, with or
    without parentheses (``@no_grad()`` and ``@no_grad``), as in PyTorch."""

    _target: bool = True

    def __new__(cls, *args, **kwargs):
        if cls is not set_grad_enabled and len(args) == 1 and not kwargs and \
                callable(args[0]) and not isinstance(args[0], bool):
            return cls()(args[0])  # used as a bare decorator
        return super().__new__(cls)

    def __enter__(self):
        self._prev = STATE.enabled
        STATE.enabled = self._target

    def __exit__(self, *exc):
        STATE.enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)
        return wrapped

    def _args(self) -> tuple:
        return ()

    def clone(self):
        return self.__class__(*self._args())


class no_grad(_Mode):
    """Disable gradient recording: ``with tessera.no_grad(): ...`` or ``@tessera.no_grad()``."""

    _target = False


class enable_grad(_Mode):
    """Enable gradient recording inside a ``no_grad`` block."""

    _target = True


class set_grad_enabled(_Mode):
    """``set_grad_enabled(False)`` as a call, a context manager or a decorator."""

    def __init__(self, mode: bool):
        self._target = bool(mode)
        self._prev = STATE.enabled
        STATE.enabled = self._target  # as a plain call it takes effect at once, like PyTorch

    def __enter__(self):
        pass

    def _args(self) -> tuple:
        return (self._target,)

    def __call__(self, fn):
        STATE.enabled = self._prev  # used as a decorator: undo the eager switch
        return super().__call__(fn)

    def __exit__(self, *exc):
        STATE.enabled = self._prev
        return False


class inference_mode(_Mode):
    """Like ``no_grad``; tensors made inside report ``is_inference()``."""

    def __init__(self, mode: bool = True):
        self._mode = bool(mode)
        self._target = not self._mode

    def __enter__(self):
        super().__enter__()
        self._prev_inf = STATE.inference
        STATE.inference = self._mode

    def __exit__(self, *exc):
        STATE.inference = self._prev_inf
        return super().__exit__(*exc)

    def _args(self) -> tuple:
        return (self._mode,)

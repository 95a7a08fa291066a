"""The hand-written C of the kernels: the files of ``tessera/kernels/c/`` (package data),
read once each.

A ``.c`` file is a whole translation unit, compiled as it is; one built per geometry or
dtype takes its parameters as ``-D`` flags (``defines``). A ``.h`` file holds the macros
and inline functions that Python instantiates after it (``DRIVERS(float, f32)``, ...).
``source(name)`` inlines each ``#include "x.h"`` of a file of that directory, so that the
text handed to ``cc.load`` is the whole program: the cache key, its hash, changes with any
file it includes. With ``-I`` that directory and their ``-D`` flags, the files also compile
on their own.

>>> "ADAM(float, f32, sqrtf)" in source("optim.c")
True
>>> '#include "window.h"' in source("window.c"), "inside(" in source("window.c")
(False, True)
>>> defines(KH=3, T="float")
('-DTSR_KH=3', '-DTSR_T=float')
"""
from __future__ import annotations

import functools
import os
import re

__all__ = ["source", "defines", "DIRECTORY"]

DIRECTORY = os.path.join(os.path.dirname(__file__), "c")

_INCLUDE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.MULTILINE)


@functools.cache
def source(name: str) -> str:
    """The text of ``c/<name>``, each ``#include "x.h"`` of a file there replaced by that
    file's text."""
    with open(os.path.join(DIRECTORY, name), encoding="utf-8") as f:
        text = f.read()
    return _INCLUDE.sub(lambda m: source(m.group(1)).rstrip("\n"), text)


def defines(**values) -> tuple[str, ...]:
    """The ``-D`` flags giving a source its parameters: ``TSR_<name>`` for each."""
    return tuple(f"-DTSR_{k}={v}" for k, v in values.items())

"""Draft proposers behind one protocol (``base.Proposer``): init its state after prefill, propose
k drafts at the start of each verify step, update after the commit.

Every module of this package is imported here and registers its proposer with ``@register``, so a
new proposer is one new module (plus its tests): docs/design.md walks through ``ngram.py``.

  lookup(name) -> the proposer class registered under ``name`` (ValueError naming the choices)
  names()      -> the registered names
"""

from __future__ import annotations

import importlib
import pkgutil

from mtpspec.decoding.proposers.base import (
    Budget,
    Committed,
    Prefilled,
    Proposal,
    Proposer,
    lookup,
    names,
    register,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Budget",
    "Committed",
    "Prefilled",
    "Proposal",
    "Proposer",
    "lookup",
    "names",
    "register",
]

"""A layer that attends every cached token: FullKV's rule, and what the core runs on a method's dense layers.

A method that keeps its first layers dense (Quest, DoubleSparsity: the official code leaves layers 0 and 1 as they
are) declares a `dense_layers` option; the core then builds this selector on those layers instead of the method's
(`MethodSpec.build`), so the method's file holds neither the rule nor its accounting, and such a layer keeps no
method state (docs/adding_a_method.md).
"""
from __future__ import annotations

from locks.core.selector import Selection, Selector


class DenseAttention(Selector):
    """Every cached token, eager and static; no state, no metadata."""

    name = "dense"
    uses_budget = False
    row_state = ()

    def select(self, query, keys, values) -> Selection:
        return Selection.all_tokens()

    def static_decode_error(self):
        return None

    def select_static(self, query, keys, values, length) -> Selection:
        return Selection.all_tokens()

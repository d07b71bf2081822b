"""FullKV: attend every cached token (the dense reference)."""
from locks.selector import Selection, Selector, register


@register
class FullKVSelector(Selector):
    name = "fullkv"
    uses_budget = False

    def select(self, query, keys, values) -> Selection:
        return Selection.all_tokens()

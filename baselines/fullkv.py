"""FullKV: attend every cached token (the dense reference)."""
from locks.selector import Selection, Selector, register


@register
class FullKVSelector(Selector):
    name = "fullkv"
    uses_budget = False

    def select(self, query, keys, values) -> Selection:
        return Selection.all_tokens()

    def static_decode_error(self):
        return None

    def select_static(self, query, keys, values, length) -> Selection:
        return Selection.all_tokens()

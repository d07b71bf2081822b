"""FullKV: attend every cached token (the dense reference)."""
from locks.core.registry import register
from locks.core.selector import Selection, Selector


@register
class FullKVSelector(Selector):
    name = "fullkv"
    display_name = "FullKV"
    report_order = 0
    uses_budget = False
    row_state = ()

    def select(self, query, keys, values) -> Selection:
        return Selection.all_tokens()

    def static_decode_error(self):
        return None

    def select_static(self, query, keys, values, length) -> Selection:
        return Selection.all_tokens()

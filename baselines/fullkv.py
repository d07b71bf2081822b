"""FullKV: attend every cached token (the dense reference)."""
from locks.core.dense import DenseAttention
from locks.core.registry import register


@register
class FullKVSelector(DenseAttention):
    name = "fullkv"
    display_name = "FullKV"
    report_order = 0

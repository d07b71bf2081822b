"""Tables and plots from finished runs (it never runs a model). One module per job: runs.py collects every
metrics.json into a DataFrame and labels the methods, tables.py and figures.py render one table unit (benchmark,
model, context), bench.py reads the GPU benchmarks' JSON lines, writer.py writes everything and is the command line:

    python -m eval.report results/                       # committed results
    python -m eval.report outputs/runs results/gpu --out outputs/report

Method names, order and line styles come from the selectors themselves (`display_name`, `report_order`,
`plot_style`; locks/core/registry.py).
"""

from eval.report.bench import (FULLKV_KERNELS, LATENCY_KEY, SPARSE_KERNELS, e2e_table, latency_table,
                               load_bench_records, load_e2e, load_latency, plot_bench_bytes_vs_context,
                               plot_e2e_speedup, plot_latency_vs_context, plot_speedup_vs_context)
from eval.report.figures import (plot_bytes_vs_context, plot_coverage_vs_budget, plot_score_vs_budget,
                                 plot_task_heatmap, save_figure, tokens_label)
from eval.report.runs import (DuplicateRunError, ReportError, assign_labels, budgets_of, find_result_files, groups,
                              load_runs, ordered_labels, task_columns, units)
from eval.report.tables import (efficiency_table, score_pivot, scores_latex, scores_long, scores_markdown,
                                task_tables, to_latex, to_markdown)
from eval.report.writer import (combine_runs, main, write_efficiency, write_group, write_report, write_scores,
                                write_unit)

__all__ = [
    "FULLKV_KERNELS", "LATENCY_KEY", "SPARSE_KERNELS", "e2e_table", "latency_table", "load_bench_records",
    "load_e2e", "load_latency", "plot_bench_bytes_vs_context", "plot_e2e_speedup", "plot_latency_vs_context",
    "plot_speedup_vs_context", "plot_bytes_vs_context", "plot_coverage_vs_budget", "plot_score_vs_budget",
    "plot_task_heatmap", "save_figure", "tokens_label", "DuplicateRunError", "ReportError", "assign_labels",
    "budgets_of", "find_result_files", "groups", "load_runs", "ordered_labels", "task_columns", "units",
    "efficiency_table", "score_pivot", "scores_latex", "scores_long", "scores_markdown", "task_tables", "to_latex",
    "to_markdown", "combine_runs", "main", "write_efficiency", "write_group", "write_report", "write_scores",
    "write_unit"
]

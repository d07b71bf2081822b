"""One script per figure or table of the write-up (paper_figs/README.md); `make figures` runs them all
(make_all.py). They read committed results under results/ only, through eval.report."""

"""What comes after training: tables, comparisons, branched rows and W&B Reports over run directories.

* ``runs``: a run directory read back (its files; its data, network and weights to score it again);
* ``report``: ``python -m swalab.results.report``, the paper-style table (``table``), its files
  (``write``), figures (``plots``) and the W&B Report (``wandb_report``);
* ``compare``: ``python -m swalab.results.compare``, every predictor of some runs scored again, and the
  paper's section 3.5 numbers (``diagnostics``);
* ``row``: ``python -m swalab.results.row``, one Table 1 row per seed off a shared SGD trunk."""

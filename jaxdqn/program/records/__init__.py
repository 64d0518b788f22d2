"""The files a run writes and how values are written in them: ``formats`` (the one definition
of number, date and table formats), ``results`` (``summary.json``, the walks' CSVs),
``logger`` (``metrics.jsonl`` and notes) with ``metric_names`` (its registry) and
``tensorboard``, and ``provenance`` (what a rerun needs)."""

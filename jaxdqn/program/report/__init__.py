"""A finished run's numbers and document: ``run_statistics`` and ``panel_results`` (what
``summary.json`` states beyond the metrics), ``document`` (``report.md``) with its sections
(``statistics_section``, ``panel_section``) and figures (``plots``, ``training_plots``)."""

"""Searches beyond one program (issue 32): an Optuna study whose trials are ordinary runs, the
``space`` of a sweep file, the ``worker`` that trains trials in any number of processes and
machines against one storage, and the ``finale``: the winner, selected on val, walked on test
once, with the Deflated Sharpe Ratio over every trial the search saw."""

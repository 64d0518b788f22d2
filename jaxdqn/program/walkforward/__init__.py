"""Walk-forward (E3, W1): ``driver`` trains every fold as a normal run, ``stitched`` joins the
folds' test segments into one out-of-sample series and its statistics, ``panel`` does it
instrument by instrument for a panel, ``document`` writes ``walkforward.md``."""

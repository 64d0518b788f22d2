"""Checkpoints (O6): ``checkpoint`` (orbax, corrupt steps moved aside), ``retention`` (which
steps are kept: latest-N ∪ best-N, and each population member's best), ``contents`` (what is
stored and the integrity checks on restore) and ``orbax_echoes`` (a failed read reported in
one line)."""
